#!/usr/bin/env python3
"""PyTorch anchors for kvscout's GPU benchmarks, at the same shapes, in the same gpu_check run.

An anchor only: the library never depends on torch. Where python3 has no torch or no CUDA device
this prints why and writes nothing (gpu_goals.py then marks the torch ratios as not measured).

Each operation is captured in a CUDA graph, ten times back to back, and the graph replayed;
the time is the replay's (CUDA events) over ten, the median of 20 replays: kernel time without
launch overhead, as kvscout's benchmarks time theirs with events.

  sdpa/rows:N          F.scaled_dot_product_attention(enable_gqa=True), one query, 32 query
                       heads, 8 kv heads x N rows, head_dim 128, fp16 (bench_attention.cu)
  spec/tokens:N        one Llama-7B layer's speculation as PyTorch would write it: q = x W_Q
                       (4096 x 4096 fp16), the skew (a 128 x 128 bmm per head), r = 32 channels
                       taken, scored against 32 heads x N partial keys of 32 fp16 channels
                       (bench_spec_select.cu's spec/N)
  spec_partial/tokens:N  the same with only W_Q's r columns per head (x W_Q[:, cols]), no skew
  topk/tokens:N        torch.topk(k = N / 10) on 32 rows of N fp32 scores (topk/N, threshold/N)

  python3 scripts/gpu_anchors.py OUT.json
"""
import json
import sys


def main(out_path):
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means no anchor
        print(f"gpu_anchors: no torch ({e}); PyTorch anchors not measured")
        return 0
    if not torch.cuda.is_available():
        print("gpu_anchors: torch sees no CUDA device; PyTorch anchors not measured")
        return 0
    dev = torch.device("cuda")
    torch.manual_seed(0)
    h = torch.float16

    def graph_time_us(fn, reps=10, trials=20):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()  # warm-up, workspace allocation
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(trials):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / reps)
        times.sort()
        return times[len(times) // 2]

    anchors = {}
    # Attention: the rows of 10 % of 16k and 32k tokens, 25 % of 128k.
    for rows in (1638, 3276, 32768):
        q = torch.randn(1, 32, 1, 128, device=dev, dtype=h)
        k = torch.randn(1, 8, rows, 128, device=dev, dtype=h)
        v = torch.randn(1, 8, rows, 128, device=dev, dtype=h)
        anchors[f"sdpa/rows:{rows}"] = graph_time_us(
            lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))

    # Speculation for one Llama-7B layer (32 heads, head_dim 128, r = 32).
    d, heads, hd, r = 4096, 32, 128, 32
    x = torch.randn(1, d, device=dev, dtype=h)
    wq = torch.randn(d, d, device=dev, dtype=h) * 0.02
    skew = torch.randn(heads, hd, hd, device=dev, dtype=h) * 0.1
    cols = torch.stack([torch.randperm(hd, device=dev)[:r] + i * hd for i in range(heads)])
    wq_part = wq[:, cols.reshape(-1)].contiguous()  # [d, heads * r]
    for n in (8192, 32768, 131072):
        pk = torch.randn(heads, n, r, device=dev, dtype=h)

        def spec(pk=pk):
            q = (x @ wq).view(heads, 1, hd)
            qs = torch.bmm(q, skew)[:, :, :r]  # skewed, first r channels
            return torch.bmm(qs, pk.transpose(1, 2))  # [heads, 1, n]

        def spec_partial(pk=pk):
            qp = (x @ wq_part).view(heads, 1, r)
            return torch.bmm(qp, pk.transpose(1, 2))

        anchors[f"spec/tokens:{n}"] = graph_time_us(spec)
        anchors[f"spec_partial/tokens:{n}"] = graph_time_us(spec_partial)
        scores = torch.randn(32, n, device=dev, dtype=torch.float32)
        anchors[f"topk/tokens:{n}"] = graph_time_us(
            lambda scores=scores, k=n // 10: torch.topk(scores, k, dim=1))

    info = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
            "unit": "us", "anchors": anchors}
    with open(out_path, "w") as f:
        json.dump(info, f, indent=1)
    for k_, v_ in anchors.items():
        print(f"{k_:28s} {v_:9.2f} us")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
