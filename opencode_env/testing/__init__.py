"""Test doubles, shipped in the package the way httpx ships its `MockTransport`, for the project's tests and yours
(the scripted model they run against is `opencode_env.scripted`).

- `stub_backend.StubBackend`: a sandbox backend that runs nothing (commands sleep and succeed, files in memory), for
  load and hostile-input tests of the server and the pipeline around the agent.
- `fake_e2b.FakeCloud` and `fake_hf.FakeHfCloud`: stand-ins for the E2B and Hugging Face SDKs that run each sandbox
  for real in a local bubblewrap sandbox, with the SDKs' signatures (tests compare them with the installed SDKs) and
  exception types, and switches for the clouds' failures; `E2BBackend(sandbox_class=cloud.sandbox_class(), ...)` and
  `HFBackend(sandbox_class=cloud.sandbox_class(), ...)` run over them. `fake_hf_plain` is the HF fake's plain mode
  (the image's smoke test). They need the local backend (bubblewrap): they are not for a machine without it.
- `proxy_process` (the capture proxy as a process), `chromium` (a real headless browser).

The pipeline imports none of them (a contract says so).
"""
