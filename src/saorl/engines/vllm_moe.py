"""MoE policies in the vLLM engine: routing capture and the CPU expert-weight repack.

**Expert weights after a push (CPU build).** vLLM 0.32's in-place reload (`reload_weights`, the
path every weight push takes) leaves fused-MoE expert weights in checkpoint layout on the CPU
build, while its CPU MoE kernel reads them prepacked (`cpu_prepack_moe_weight`): a Qwen3-MoE
whose weights were pushed samples with log-probs ~0.03 off the same model loaded from disk. After
each push, `repack_cpu_experts` prepacks every expert tensor that still holds the pushed
checkpoint values (so a vLLM that repacks by itself is left alone).

**Routing** (`algorithm.routing_replay` with `rollout.engine = "vllm"`): the record the HF
engine keeps (`saorl.models.routing`): for every position of a request, the experts each MoE
layer routed it to when vLLM last computed it, `-1` where it never did (the last sampled token).

vLLM 0.32's own option, `enable_return_routed_experts`, is not used: it needs the V2 model
runner, which needs Triton, and the CPU build refuses it ("AuxOutput Connector requires Model
Runner V2", then "Model Runner V2 requires Triton"), so no test here could run it. The engine
runs in this process (see `saorl.engines.vllm`), so the recorder instead sets the capture
callback every vLLM MoE router offers (`BaseRouter.set_capture_fn`, called with the top-k expert
ids of each forward, the hook vLLM's own capturer binds) and, at the first MoE layer of each
forward, reads from the V1 model runner which request each token row belongs to (`input_batch`:
request ids, the position of their first row, `query_start_loc`). Requirements that follow:

- the V1 model runner (`VLLM_USE_V2_MODEL_RUNNER=0`, the CPU build's only runner);
- eager execution: a CUDA graph or compiled forward would not call Python callbacks;
- no reading of the prefix cache (`skip_reading_prefix_cache`): a position served from the
  cache is not computed, so it would have no routing. A preempted request (a weight update with
  `rollout.vllm_recompute_kv_on_update`) re-prefills from position 0, and its new routing
  replaces the old, as in the HF engine.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from saorl.config import ConfigError
from saorl.models.routing import UNKNOWN, routing_dtype

Chunk = tuple[int, torch.Tensor]  # (first position, (rows, moe_layers, top_k))
Experts = tuple[str, Any, str]  # (vLLM module name, the module, its kernel's packing ISA)


def _runner(worker: Any) -> Any:
    return worker.model_runner


class VLLMRoutingRecorder:
    """Capture callbacks on the MoE routers of an in-process vLLM `LLMEngine` (module doc)."""

    def __init__(self, llm: Any, num_experts: int, moe_layers: int) -> None:
        self._runner = llm.collective_rpc(_runner)[0]
        batch = getattr(self._runner, "input_batch", None)
        if batch is None or not hasattr(batch, "num_computed_tokens_cpu"):
            raise ConfigError(
                "algorithm.routing_replay with rollout.engine='vllm' records routing through "
                f"vLLM's V1 model runner; this one is {type(self._runner).__name__} (unset "
                "VLLM_USE_V2_MODEL_RUNNER), or use rollout.engine='hf'"
            )
        from vllm.model_executor.layers.fused_moe.layer import MoERunner

        moes = [m for m in self._runner.get_model().modules() if isinstance(m, MoERunner)]
        self.routers = [m.router for m in sorted(moes, key=lambda m: m.layer_id)]
        if len(self.routers) != moe_layers or not all(
            hasattr(r, "set_capture_fn") for r in self.routers
        ):
            raise ConfigError(
                f"algorithm.routing_replay: vLLM built {len(self.routers)} MoE routers "
                f"({sorted({type(r).__name__ for r in self.routers})}) for a policy with "
                f"{moe_layers} MoE layers, or routers without capture; use rollout.engine='hf'"
            )
        self.dtype = routing_dtype(num_experts)
        # One entry per forward: (request ids, first position of each, row offsets, per layer ids)
        self._steps: list[tuple[list[str], list[int], list[int], list[torch.Tensor]]] = []
        for i, r in enumerate(self.routers):
            r.set_capture_fn(partial(self._capture, i))

    def _capture(self, layer: int, topk_ids: torch.Tensor) -> None:
        if layer == 0:
            batch = self._runner.input_batch
            n = batch.num_reqs
            self._steps.append(
                (
                    list(batch.req_ids[:n]),
                    batch.num_computed_tokens_cpu[:n].tolist(),
                    self._runner.query_start_loc.np[: n + 1].tolist(),
                    [],
                )
            )
        self._steps[-1][3].append(topk_ids.clone())

    def take(self) -> dict[str, list[Chunk]]:
        """The routing of the forwards since the last call, by request id (the id given to
        `add_request`): chunks `(first position, (rows, moe_layers, top_k))` on the CPU."""
        steps, self._steps = self._steps, []
        out: dict[str, list[Chunk]] = {}
        for req_ids, starts, offsets, layers in steps:
            if len(layers) != len(self.routers):
                raise RuntimeError(
                    f"vLLM routing recorder: {len(layers)} router calls in one "
                    f"forward, expected {len(self.routers)}"
                )
            # Rows past the last request's are padding (CUDA-graph batch sizes).
            idx = torch.stack([t[: offsets[-1]] for t in layers], dim=1).to(self.dtype).cpu()
            for j, rid in enumerate(req_ids):
                # vLLM's internal id is "<our id>-<8 random characters>".
                chunk = (starts[j], idx[offsets[j] : offsets[j + 1]])
                out.setdefault(rid.rpartition("-")[0] or rid, []).append(chunk)
        return out

    def close(self) -> None:
        for r in self.routers:
            r.set_capture_fn(None)


def assemble(chunks: list[Chunk], length: int) -> torch.Tensor | None:
    """`(length, moe_layers, top_k)`: each chunk written at its positions in order (a later
    forward of a position replaces an earlier one), `-1` at positions none covered."""
    if not chunks:
        return None
    first = chunks[0][1]
    out = first.new_full((length, *first.shape[1:]), UNKNOWN)
    for start, rows in chunks:
        rows = rows[: max(0, length - start)]
        out[start : start + len(rows)] = rows
    return out


def cpu_expert_layers(llm: Any) -> list[Experts]:
    """The fused-MoE expert modules of `llm` whose CPU kernel reads prepacked weights."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a build without CPU MoE kernels
        return []
    out = []
    for name, m in llm.collective_rpc(_runner)[0].get_model().named_modules():
        kernel = getattr(getattr(m, "quant_method", None), "moe_kernel", None)
        experts = getattr(getattr(kernel, "impl", None), "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts) and not experts._use_zentorch:
            out.append((name, m, experts.isa))
    return out


def repack_cpu_experts(layers: list[Experts], state: dict[str, torch.Tensor]) -> int:
    """Prepack the expert weights of `layers` that hold `state`'s checkpoint values as pushed
    (transformers' fused `experts.gate_up_proj` / `experts.down_proj`); how many it repacked."""
    if not layers:  # a dense model, or no CPU MoE kernel: nothing to import or repack
        return 0
    from vllm._custom_ops import cpu_prepack_moe_weight

    done = 0
    for name, module, isa in layers:
        prefix = name.removesuffix(".routed_experts")
        for attr, key in (("w13_weight", "gate_up_proj"), ("w2_weight", "down_proj")):
            param = getattr(module, attr)
            pushed = state.get(f"{prefix}.{key}")
            if pushed is None or param.shape != pushed.shape:
                continue
            with torch.no_grad():
                if torch.equal(param, pushed.to(param.dtype)):
                    param.copy_(cpu_prepack_moe_weight(param.clone(), isa))
                    done += 1
    return done
