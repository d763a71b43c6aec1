"""Agent programs: a user's own program (a function, or a command) that calls the model through
an OpenAI-compatible endpoint while saorl records every token for training.

- `server.py`: the endpoint (one per rollout worker): routes, sessions, calls to the engine;
- `asgi.py`: its HTTP layer, an ASGI app served by uvicorn in a thread of its own;
- `wire.py`: the wire format (chat completions and responses requests and replies);
- `runs.py`: one agent run (its session, turns and limits); `records.py`: what a run recorded,
  turned into a trajectory.

The environment that runs the programs themselves is `saorl.envs.agent` (with its command
agents' processes in `saorl.envs.agent_procs`).
"""
