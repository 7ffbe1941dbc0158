"""The presets by name, their budgets and their calibration (presets.hpp, calibrate.hpp)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ._parts import KeepSet, _lib
from ._policy import _AGGREGATIONS, _MODES, _STYLES, DecodeShape, InfiniGenPolicy, RopeConfig, \
    SkewPlans, _lookup

_named = _lib.preset_named
_budgets = _lib.preset_budgets
_layer_shares = _lib.preset_layer_shares
_calibrate = _lib.preset_calibrate
_has_calibration = _lib.built_with_calibration

_SELECTORS = {"topk": 0, "threshold": 1}
_RULES = {"infinigen_mean": 0, "per_head": 1}
_LAYER_RULES = {"coverage": 0, "mass": 1}


def _name_of(table, value):
    return next(k for k, v in table.items() if v == value)


@dataclass(frozen=True)
class SpeculationPreset:
    """A named speculation configuration (presets::speculation_preset): what kvscout's presets set
    and a caller may change (dataclasses.replace)."""

    name: str
    mode: str
    partial_ratio: float
    r: int
    union_with_keys: bool
    aggregation: str
    query_aggregation: str | None
    correction_r: int
    selector: str
    alpha: float
    rule: str
    keep: KeepSet
    skip_layers: int
    correction_share: float
    key_bits: int
    layer_rule: str | None
    layer_floor: float
    layer_bins: int

    def fields(self):
        q = (-1 if self.query_aggregation is None else
             _lookup(_AGGREGATIONS, self.query_aggregation, "query_aggregation"))
        lr = -1 if self.layer_rule is None else _lookup(_LAYER_RULES, self.layer_rule, "layer_rule")
        return [float(v) for v in (
            _lookup(_MODES, self.mode, "mode"), self.partial_ratio, self.r, self.union_with_keys,
            _lookup(_AGGREGATIONS, self.aggregation, "aggregation"), q, self.correction_r,
            _lookup(_SELECTORS, self.selector, "selector"), self.alpha,
            _lookup(_RULES, self.rule, "rule"), self.keep.sinks, self.keep.recent,
            self.skip_layers, self.correction_share, self.key_bits, lr, self.layer_floor,
            self.layer_bins)]

    def correction_channels(self) -> int:
        return self.correction_r if self.correction_r > 0 else self.r

    def policy_correction_r(self) -> int:
        """The policy's correction_r (presets::speculation_preset::policy_config)."""
        wide = self.correction_share > 0 and self.correction_channels() > self.r
        return self.correction_channels() if wide else 0


def preset(name: str, head_dim: int) -> SpeculationPreset:
    """"infinigen_paper", "kvscout_default" or "kvscout_speculation_only" at head_dim."""
    f = list(_named(name, head_dim))
    return SpeculationPreset(
        name=name, mode=_name_of(_MODES, f[0]), partial_ratio=f[1], r=int(f[2]),
        union_with_keys=bool(f[3]), aggregation=_name_of(_AGGREGATIONS, f[4]),
        query_aggregation=None if f[5] < 0 else _name_of(_AGGREGATIONS, f[5]),
        correction_r=int(f[6]), selector=_name_of(_SELECTORS, f[7]), alpha=f[8],
        rule=_name_of(_RULES, f[9]), keep=KeepSet(int(f[10]), int(f[11])),
        skip_layers=int(f[12]), correction_share=f[13], key_bits=int(f[14]),
        layer_rule=None if f[15] < 0 else _name_of(_LAYER_RULES, f[15]), layer_floor=f[16],
        layer_bins=int(f[17]))


@dataclass(frozen=True)
class StepBudgets:
    """presets::step_budgets: per layer the speculation's share (0 below skip_layers) and the
    step's total share, the selections' capacities and the keep-set."""

    speculated: np.ndarray
    total: np.ndarray
    capacity: int
    correction_capacity: int
    keep: KeepSet

    def selector_args(self, layer: int) -> dict:
        """topk_select's keyword arguments for `layer`."""
        return dict(budget=self.capacity, capacity=self.capacity, keep=self.keep,
                    budget_share=float(self.speculated[layer]))

    def correction_args(self, layer: int) -> dict:
        """correction_select's keyword arguments for `layer` (extra, total_share)."""
        return dict(extra=self.correction_capacity, total_share=float(self.total[layer]))


def budgets(p: SpeculationPreset, shape: DecodeShape, budget: float, layer_shares=None):
    """The preset's budgets at `budget`, a share of the cached rows per step."""
    L = shape.num_layers
    spec, total = np.zeros(L), np.zeros(L)
    shares = np.zeros((0,)) if layer_shares is None else np.ascontiguousarray(layer_shares,
                                                                              np.float64)
    cap, corr = _budgets(p.name, p.fields(), shape.model_dims(), float(budget), shares, spec, total)
    return StepBudgets(spec, total, int(cap), int(corr), p.keep)


@dataclass(frozen=True)
class Calibration:
    """What presets::calibrate measured: per layer its SkewPlans (None below first_layer), the
    correction's (or None), the mass curves [L, bins] (or None)."""

    plans: list
    correction_plans: list | None
    mass_curves: np.ndarray | None
    first_layer: int

    def layer_shares(self, p: SpeculationPreset, budget: float):
        """Per-layer shares of `budget` by the preset's layer rule; None without one."""
        if p.layer_rule is None:
            return None
        out = np.zeros(self.mass_curves.shape[0])
        _layer_shares(p.name, p.fields(), self.mass_curves, self.first_layer, float(budget), out)
        return out


def calibration_available() -> bool:
    """Whether this build has calibration (it needs Eigen 3 at build time)."""
    return bool(_has_calibration())


def calibrate(p: SpeculationPreset, shape: DecodeShape, rope: RopeConfig, q, k) -> Calibration:
    """presets::calibrate on a calibration text's queries q [L, n, Hq, D] and keys k [L, n, H, D]
    (float32, after RoPE, as attention sees them)."""
    L, H, D = shape.num_layers, shape.num_kv_heads, shape.head_dim
    style = _lookup(_STYLES, rope.style, "rope style")
    if rope.head_dim != D:
        raise ValueError(f"rope.head_dim {rope.head_dim}, expected the shape's head_dim {D}")
    fields = p.fields()  # checks the names before anything is allocated
    wide = p.correction_share > 0 and p.correction_channels() > p.r
    rc = p.correction_channels()

    def outputs(r, present):
        if not present:
            return np.zeros((0,), np.int32), np.zeros((0,), np.float32), np.zeros((0,), np.int32)
        if p.mode == "rope_planes":
            return (np.zeros((L, H, r // 2), np.int32), np.zeros((0,), np.float32),
                    np.zeros((0,), np.int32))
        return (np.zeros((0,), np.int32), np.zeros((L, H, D, D), np.float32),
                np.zeros((L, H, r), np.int32))

    spec_out, corr_out = outputs(p.r, True), outputs(rc, wide)
    curves = np.zeros((L, p.layer_bins)) if p.layer_rule is not None else np.zeros((0,))
    first = int(_calibrate(p.name, fields, shape.model_dims(), float(rope.theta), style, q, k,
                           *spec_out, *corr_out, curves))

    def plans_of(out, r):
        planes, A, ch = out
        return [None if l < first else SkewPlans(
            mode=p.mode, r=r, rope=rope, planes=planes[l] if planes.size else None,
            A=A[l] if A.size else None, channels=ch[l] if ch.size else None) for l in range(L)]

    return Calibration(plans_of(spec_out, p.r), plans_of(corr_out, rc) if wide else None,
                       curves if curves.size else None, first)


def policy_for_layer(p: SpeculationPreset, shape: DecodeShape, cal: Calibration, layer: int, w_q,
                     b_q=None) -> InfiniGenPolicy:
    """Layer `layer`'s InfiniGenPolicy as the preset configures it (its plans, the correction's
    where the preset corrects over more channels, its key bits and aggregations)."""
    if cal.plans[layer] is None:
        raise ValueError(f"layer {layer} has no plans: it is below the calibration's first "
                         f"speculated layer {cal.first_layer}")
    corr = cal.correction_plans[layer] if p.policy_correction_r() > 0 else None
    return InfiniGenPolicy(shape, cal.plans[layer], w_q, b_q, correction_plans=corr,
                           key_bits=p.key_bits, aggregation=p.aggregation,
                           query_aggregation=p.query_aggregation)


from ._pipeline import FetchStats, Pipeline  # noqa: E402  (it imports budgets from here)

replace = dataclasses.replace
