"""Parsyn's Python package: safetensors I/O (parsyn.safetensors), the trainer contract for training scripts
(parsyn.trainer) and a client of the coordinator's REST API (parsyn.client). Submodules are imported on use, so
`import parsyn.client` pulls in neither NumPy nor torch."""

__version__ = "0.1.0"
