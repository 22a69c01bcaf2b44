#!/usr/bin/env bash
# ONNX Runtime for streambatch's `onnxruntime` engine: installs the pinned
# onnxruntime wheel into a venv outside the clone and links its library to
# ~/.cache/streambatch-onnxruntime/libonnxruntime.so, where the engine
# looks when ORT_DYLIB_PATH is unset. Nothing is downloaded at build time:
# the library is loaded when a model first runs. Without it, models run on
# rten, the pure-Rust engine.
#
#   tools/setup-onnxruntime.sh          # the CPU library
#   ORT_WHEEL=onnxruntime-gpu tools/setup-onnxruntime.sh   # CUDA (NVIDIA)
set -euo pipefail
wheel="${ORT_WHEEL:-onnxruntime}"
version="${ORT_VERSION:-1.31.1}"
venv="${HOME}/.cache/streambatch-onnxruntime/venv"
link="${HOME}/.cache/streambatch-onnxruntime/libonnxruntime.so"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q "$wheel==$version"
lib=$(ls "$venv"/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* | head -n1)
ln -sf "$lib" "$link"
echo "ONNX Runtime $version: $link -> $lib"
