"""Portable models: `cvae export` writes one self-describing folder from a checkpoint.

The folder (docs/export.md) holds the weights as safetensors under stable names, the config,
a model card, a sample grid, the sampler's functions as serialized StableHLO (`jax.export`)
and as ONNX, and a manifest with each file's sha256. The package's own loader (`load`) reads
it back into a sampler without Orbax or an optimizer, for `cvae sample` and `cvae serve`.

Modules: `manifest` (hashes, standard library only), `weights` (safetensors and names),
`load` (a folder -> a sampler), `functions` (what is exported), `stablehlo`, `onnx_files`,
`card` (the README.md model card) and `run` (`cvae export`: write, verify, move in place).
"""
