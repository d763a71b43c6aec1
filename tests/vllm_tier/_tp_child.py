"""One vLLM engine over two CPU workers (`rollout.vllm_tensor_parallel_size = 2`), in a process
of its own (vLLM spawns its workers, which import this file as their main module: hence the
guard): a push lands on requests in flight; prints what the test checks, as JSON."""

from __future__ import annotations

import copy
import json
import sys
import time

import torch


def main() -> None:
    from saorl.engines.factory import build_engine
    from saorl.engines.protocol import GenerationRequest
    from saorl.models.loading import load_policy
    from saorl.models.logprobs import sequence_logprobs
    from tests.conftest import tiny_config
    from tests.vllm_tier.test_vllm_engine import ENGINE, MODEL

    tp = int(sys.argv[1])
    cfg = tiny_config(*MODEL, *ENGINE, f"rollout.vllm_tensor_parallel_size={tp}")
    policy, tok = load_policy(cfg.model)
    original = copy.deepcopy(policy)
    t0 = time.perf_counter()
    engine = build_engine(cfg, policy, tok, seed=0)
    startup = time.perf_counter() - t0
    for i, p in enumerate(["12+34=", "7+8=", "99+1=", "5+5="]):
        ids = tok.encode(p, add_special_tokens=False)
        engine.add_request(GenerationRequest(prompt_ids=ids, max_new_tokens=8, request_id=i))
    done = engine.step() + engine.step() + engine.step()  # 3 tokens each, then the push
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.update_weights(policy.state_dict(), 1)
    while engine.num_unfinished():
        done += engine.step()
    engine.close()
    gaps = {0: 0.0, 1: 0.0}  # per version: the engine's log-probs against that policy's
    for c in done:
        ids = torch.tensor([c.request.prompt_ids + c.token_ids])
        for version, model in ((0, original), (1, policy)):
            lp = sequence_logprobs(model, ids, torch.ones_like(ids))[0, -len(c.token_ids) :]
            mask = torch.tensor([v == version for v in c.versions])
            if mask.any():
                diff = (lp - torch.tensor(c.logprobs))[mask].abs().max()
                gaps[version] = max(gaps[version], float(diff))
    out = {"startup_s": startup, "versions": [c.versions for c in done], "gaps": gaps}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
