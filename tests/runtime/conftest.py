"""Runtime pieces that need no worker process and no model.

Pure decisions (probes, exit classification, the batching policy) are tables with ``now``
passed in: no clock, no process, no event loop.

Real: the tensor codec with numpy, the frame codec, ``choose_limits``. Faked: a model's
signature is a hand-written ``TensorSpec`` (no onnxruntime session); the cgroup v2 tree is a
plain directory under ``tmp_path`` (so only the writes edged makes are checked, not the
kernel's answer to them).
"""
