"""The endpoint pre-flight: one probe call before any sandbox (probe.py), and why it failed, with the fix
(probe_diagnosis.py)."""
