"""The scripted model: a real OpenAI-compatible HTTP server on loopback that answers from a script. It is the demo's
model (`opencode-env demo`, `model: "scripted"`), the examples' and every test's; `python -m opencode_env.scripted`
serves one in a process of its own.

- `model.ScriptedModelServer` and `script` (the steps it answers with); `chat_template` (a toy tokenizer and
  template, for token-in); `builtin` (the one launched for `model: "scripted"`); `demo` (the demo task);
  `threaded_server` (an ASGI app on a loopback thread).
"""
