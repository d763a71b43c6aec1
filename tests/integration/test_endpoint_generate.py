"""The training endpoint's token route, `POST /inference/v1/generate` (vLLM's shape, as
verifiers' training client sends it), with a real HTTP client against a real rollout worker and
server: the reply carries the sampled ids and their log-probs as the engine gave them, calls
that extend the episode's tokens are one trajectory with the tokens in between masked, other
prompts start a segment, and bad requests get clear 4xx errors."""

from __future__ import annotations

import httpx

from tests.integration._endpoint_harness import Recording, run_agents
from tests.integration.test_agent_loop import ScriptedEngine
from tests.integration.test_tool_call_loop import _tokenizer

TASK = {"prompt": "2+2?", "key": "t0"}


def _generate_url(base_url: str) -> str:
    # as verifiers' renderer client builds it: the route sits beside /v1, not under it
    return base_url.removesuffix("/v1") + "/inference/v1/generate"


async def _token_agent(task, client, tok, seen: dict):
    base = str(client.base_url).rstrip("/")
    url, headers = _generate_url(base), {"Authorization": f"Bearer {client.api_key}"}
    async with httpx.AsyncClient(timeout=30) as http:
        models = (await http.get(f"{base}/models", headers=headers)).json()
        seen["max_model_len"] = models["data"][0]["max_model_len"]
        prompt = tok.encode("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
        params = {"max_tokens": 50, "temperature": 0.7, "stop_token_ids": [tok.eos_token_id]}
        body = {"model": "policy", "token_ids": prompt, "sampling_params": params}
        first = (await http.post(url, json=body, headers=headers)).json()
        ids = first["choices"][0]["token_ids"]
        # the next turn extends the tokens exactly: prompt, sampled ids, new observation ids
        obs = tok.encode("\n<|im_start|>user\nsure?<|im_end|>\n<|im_start|>assistant\n")
        body = {**body, "token_ids": prompt + ids + obs}
        second = (await http.post(url, json=body, headers=headers)).json()
        # a prompt that does not extend them (a rewritten history) starts a segment
        body = {**body, "token_ids": tok.encode("<|im_start|>user\n4?<|im_end|>\n")}
        third = (await http.post(url, json=body, headers=headers)).json()
        bad = {
            "vocab": {**body, "token_ids": [10**6]},
            "empty": {**body, "token_ids": []},
            "model": {**body, "model": "gpt-4"},
            "n": {**body, "sampling_params": {"n": 2}},
        }
        seen["errors"] = {
            k: (r.status_code, r.json()["error"]["message"])
            for k, b in bad.items()
            for r in [await http.post(url, json=b, headers=headers)]
        }
        root = f"http://{client.base_url.host}:{client.base_url.port}"
        nobody = await http.post(f"{root}/inference/v1/generate", json=body)  # names no episode
        seen["no_episode"] = nobody.status_code
    seen.update(prompt=prompt, obs=obs, replies=[first, second, third])
    return 1.0


def test_token_calls_are_recorded_token_exact():
    tok = _tokenizer("hermes")
    engine = Recording(ScriptedEngine(tok, ["four", "yes, 4", "4"]))
    seen: dict = {}

    async def agent(task, client):
        return await _token_agent(task, client, tok, seen)

    trajs, _ = run_agents(engine, tok, [TASK], agent, max_seq_len=512)
    assert seen["max_model_len"] == 512
    first = seen["replies"][0]
    sampled = [c.token_ids for c in engine.completions]
    for reply, ids, c in zip(seen["replies"], sampled, engine.completions, strict=True):
        choice = reply["choices"][0]
        assert choice["token_ids"] == ids  # exactly what the engine sampled, EOS included
        assert [e["logprob"] for e in choice["logprobs"]["content"]] == c.logprobs
        assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{t}" for t in ids]
        assert choice["finish_reason"] == "stop"
    assert first["usage"]["prompt_tokens"] == len(seen["prompt"])
    # the EOS stop id is the engine's own; the request's prompt reached the engine as sent
    assert engine.requests[0].prompt_ids == seen["prompt"]
    assert engine.requests[1].prompt_ids == seen["prompt"] + sampled[0] + seen["obs"]

    assert len(trajs) == 2 and all(t.reward == 1.0 for t in trajs)
    one, two = sorted(trajs, key=lambda t: -len(t.completion_ids))
    assert one.prompt_ids == seen["prompt"]
    assert one.completion_ids == sampled[0] + seen["obs"] + sampled[1]
    assert one.loss_mask == [1] * len(sampled[0]) + [0] * len(seen["obs"]) + [1] * len(sampled[1])
    assert one.rollout_logprobs[: len(sampled[0])] == engine.completions[0].logprobs
    assert two.completion_ids == sampled[2]
    assert one.info["agent/segments"] == 2 and one.info["agent/calls"] == 3

    errors = seen["errors"]
    assert errors["vocab"][0] == 400 and "outside the vocabulary" in errors["vocab"][1]
    assert errors["empty"][0] == 400 and "token_ids" in errors["empty"][1]
    assert errors["model"][0] == 404
    assert errors["n"][0] == 400 and "one sample" in errors["n"][1]
    assert seen["no_episode"] == 401
