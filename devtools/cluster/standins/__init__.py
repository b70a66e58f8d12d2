"""Stand-ins the test kubelet puts where a GPU node has NVIDIA software no CPU machine can run: `trtexec` (the
TensorRT image's command-line tool) and Triton's `tensorrt` backend. Both are named as stand-ins wherever a test
uses them. A stand-in "plan" is `STANDIN_MAGIC` followed by the ONNX model it was made from: the backend runs that
model with onnxruntime, so what Conch reads back is computed, not made up."""

#: First bytes of a stand-in plan: TensorRT's own plan magic (`ftrt`), then a tag saying what it really is.
STANDIN_MAGIC = b"ftrt" + b"CONCH-STANDIN-PLAN\n"
