"""``kvpolicy upstream check`` speed on a TensorRT-LLM-sized tree, against reading the same files.

The tree is generated (kvpolicy's own code in upstream's layout: a registry index, a few hundred
modeling files of upstream's typical size with registered classes, hooks, inheritance across modules
and delegation, the config, resolver and transceiver files). Three figures, side by side in one run
(the machines are shared and noisy), each the median of several runs:

- **read**: opening and reading every ``.py`` file of the scope (what any tool pays);
- **read + parse**: the same plus ``ast.parse`` of each (the floor of an AST-based check);
- **check (cold)**: ``kvpolicy upstream check TREE`` in a new process, policy loading included.

    python bench/upstream.py [--files N] [--runs N]
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FILLER_FUNCTIONS = 40  # ~25 KB a modeling file, about upstream's median


def _filler(index: int) -> str:
    parts = []
    for n in range(FILLER_FUNCTIONS):
        parts.append(
            f"    def forward_{n}(self, hidden_states, attn_metadata, residual=None):\n"
            f"        # layer {n} of model {index}\n"
            f"        if residual is not None and hidden_states.shape[-1] > {n}:\n"
            f"            hidden_states = hidden_states + residual * {n + 1}\n"
            f"        out = self.layers[{n}](hidden_states, attn_metadata=attn_metadata)\n"
            f"        return self.norm(out) if self.config.num_layers > {n} else out\n\n"
        )
    return "".join(parts)


def write_tree(root: Path, files: int) -> None:
    models = root / "tensorrt_llm/_torch/models"
    models.mkdir(parents=True)
    (root / "tensorrt_llm/__init__.py").write_text("")
    (root / "tensorrt_llm/version.py").write_text('__version__ = "9.9.0rc1"\n')
    (models / "__init__.py").write_text("")
    (models / "modeling_utils.py").write_text(
        "def register_auto_model(name):\n    def wrap(cls):\n        return cls\n    return wrap\n\n\n"
        "class DecoderModelForCausalLM:\n    pass\n"
    )
    index = ["MODEL_ARCH_TO_MODULE = {"]
    for n in range(files):
        base = "DecoderModelForCausalLM" if n % 3 else f"Model{n - 1}ForCausalLM" if n else "DecoderModelForCausalLM"
        imports = "from .modeling_utils import DecoderModelForCausalLM, register_auto_model\n"
        if base != "DecoderModelForCausalLM":
            imports += f"from .modeling_m{n - 1} import {base}\n"
        hooks = ""
        if n % 7 == 0:
            hooks = '    @classmethod\n    def get_preferred_transceiver_runtime(cls, pretrained_config=None):\n        """PYTHON."""\n        return "PYTHON"\n\n'
        if n % 11 == 0:
            hooks += '    @classmethod\n    def get_model_defaults(cls, llm_args):\n        return {"kv_cache_config": {"use_kv_cache_manager_v2": True}}\n\n'
        text = f'{imports}\n\n@register_auto_model("Model{n}ForCausalLM")\nclass Model{n}ForCausalLM({base}):\n{hooks}{_filler(n)}'
        (models / f"modeling_m{n}.py").write_text(text)
        index.append(f'    "Model{n}ForCausalLM": "modeling_m{n}",')
    (models / "_arch_index.py").write_text("\n".join(index + ["}"]) + "\n")
    llmapi = root / "tensorrt_llm/llmapi"
    llmapi.mkdir(parents=True)
    (llmapi / "llm_args.py").write_text(
        "from typing import Literal, Optional\nfrom pydantic import Field\n\n"
        '_CACHE_TRANSCEIVER_BACKEND_ENV_VARS = ("TRTLLM_USE_NIXL_KVCACHE", "TRTLLM_USE_UCX_KVCACHE")\n\n\n'
        "class CacheTransceiverConfig:\n"
        '    backend: Optional[Literal["DEFAULT", "UCX", "NIXL", "MOONCAKE", "MPI"]] = Field(default=None)\n'
        '    transceiver_runtime: Optional[Literal["CPP", "PYTHON", "auto"]] = Field(default="auto")\n'
        "    kv_transfer_timeout_ms: Optional[int] = Field(default=None)\n\n\n"
        "class KvCacheConfig:\n"
        '    use_kv_cache_manager_v2: bool | Literal["auto"] = Field(default="auto")\n' + _filler(0).replace("    def", "def").replace("\n        ", "\n    ")
    )
    (llmapi / "llm_utils.py").write_text(
        "def _resolve_transceiver_runtime_auto(llm_args, model_cls):\n    return 'PYTHON'\n\n\n"
        "def _resolve_kv_cache_manager_v2_auto(llm_args, model_cls):\n    return False\n"
    )


def _median(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "trtllm"
        write_tree(root, args.files)
        paths = sorted(p for p in root.rglob("*.py"))
        size = sum(p.stat().st_size for p in paths)

        def read() -> None:
            for p in paths:
                p.read_bytes()

        def parse() -> None:
            for p in paths:
                ast.parse(p.read_bytes())

        exe = Path(sys.executable).with_name("kvpolicy")
        env = {**os.environ, "KVPOLICY_CACHE_DIR": str(Path(tmp) / "cache")}

        def check() -> None:
            out = subprocess.run([str(exe), "upstream", "check", str(root)], capture_output=True, text=True, env=env, check=False)
            if out.returncode not in (0, 1):
                raise SystemExit(out.stderr)

        t_read = _median(read, args.runs)
        t_parse = _median(parse, args.runs)
        t_check = _median(check, args.runs)
    print(f"tree: {len(paths)} files, {size / 1e6:.1f} MB (generated, upstream's layout)")
    print("| what | median | x read |")
    print("|---|---|---|")
    for name, value in (("read every file", t_read), ("read + ast.parse", t_parse), ("kvpolicy upstream check (cold, new process)", t_check)):
        print(f"| {name} | {value * 1000:.0f} ms | {value / t_read:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
