#!/usr/bin/env python3
"""A small passkey-style prompt file for the accuracy harness's stage prompts (issue 32).

Each line: {"input": filler text with a five-digit pass key at some depth, then the question,
"target": " <key>"}; the filler is three sentences written for this file, repeated. Seeded.

    python3 scripts/make_passkey.py --out tests/data/passkey_example.jsonl
    build-accuracy/tools/kvscout_accuracy --model M.gguf --prompts tests/data/passkey_example.jsonl --out DIR
"""
import argparse
import json
import random

FILLER = ("The river ran past the mill and under the old stone bridge. "
          "Farmers brought their grain to town on the first day of each week. "
          "In winter the roads froze and the children skated on the pond. ")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--records", default="12:0.2,12:0.8,20:0.5",
                    help="comma list of REPEATS:DEPTH (filler repeats, share of them before the key)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w", encoding="utf-8") as f:
        for i, item in enumerate(args.records.split(",")):
            reps, depth = item.split(":")
            reps, depth = int(reps), float(depth)
            key = rng.randint(10000, 99999)
            parts = [FILLER] * reps
            parts.insert(int(depth * reps), f"The pass key is {key}. Remember it. {key} is the pass key. ")
            text = ("There is a pass key hidden in this text. Find it and remember it.\n" + "".join(parts) +
                    "\nWhat is the pass key? The pass key is")
            f.write(json.dumps({"id": i, "input": text, "target": f" {key}"}) + "\n")


if __name__ == "__main__":
    main()
