"""Runs inside vLLM's worker process (`LLM(worker_extension_cls=...)`): the in-place weight swap.

vLLM mixes this class into its worker; `LLM.collective_rpc("undertow_reload", args=(path,))` calls
it. The weights travel as a safetensors file, not through the RPC (hundreds of MB of pickled
tensors). `model_runner.reload_weights` maps HF checkpoint names onto vLLM's fused layers and
repacks them for the CPU kernels; writing into `model.load_weights` directly does not (on CPU the
repacked parameters show shape [0] afterwards).
"""

from __future__ import annotations


class WeightReload:
    """The method vLLM's worker gains."""

    def undertow_reload(self, path: str) -> int:
        """Load the HF-named tensors of the safetensors file at `path` in place; returns their count."""
        from safetensors.torch import load_file

        tensors = load_file(path)
        reload = getattr(self, "reload_weights", None) or self.model_runner.reload_weights  # worker's sets the config
        reload(weights_iterator=iter(tensors.items()))
        return len(tensors)

    def undertow_reload_files(self, paths: list[str]) -> int:
        """Load the HF-named tensors of safetensors bucket files in place, streamed one tensor at a
        time (a version is never whole in memory twice); returns their count."""
        from safetensors import safe_open

        count = 0

        def tensors():
            nonlocal count
            for path in paths:
                with safe_open(path, framework="pt") as f:
                    for name in f.keys():
                        count += 1
                        yield name, f.get_tensor(name)

        reload = getattr(self, "reload_weights", None) or self.model_runner.reload_weights
        reload(weights_iterator=tensors())
        return count
