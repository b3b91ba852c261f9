"""`ops/bench/host_parts.py` at tiny sizes: each part's report, never its timings."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from tests.bench.scripts import load_script
from worker.engine.sampler import Sampler
from worker.engine.token_decoder import decoder_for
from worker.models.loader import load_tokenizer


def test_each_part_reports_what_it_timed(tiny_model_dir: Path) -> None:
    bench = load_script("host_parts")
    threads = ["--threads", str(torch.get_num_threads())]  # set process-wide: leave it as it was
    detok = bench.main(["detokenize", "--tokens", "200", "--repeats", "2", "--tokenizer",
                        str(tiny_model_dir), *threads])  # fmt: skip
    keys = {"bytes_us_per_token", "bytes_stops_us_per_token", "window_us_per_token"}
    assert keys | {"window_stops_us_per_token"} <= detok.keys()
    assert all(detok[k] > 0 for k in keys)
    # The byte table withheld for the window's runs is back.
    tokenizer = load_tokenizer(tiny_model_dir)
    table = decoder_for(tokenizer, True).token_bytes
    assert table is not None
    bench.detokenize(argparse.Namespace(tokens=50, repeats=1), tokenizer)
    assert decoder_for(tokenizer, True).token_bytes is table

    sampled = bench.main(["sampler", "--rows", "3", "--repeats", "2", *threads])
    assert {"t1.0_3_rows_ms", "t0.7_seeded_3_rows_ms", "t0.7_top_p_0.9_3_rows_ms"} <= set(sampled)

    sample_ids = Sampler.sample_ids
    run = bench.main(["batch", "--model", str(tiny_model_dir), "--requests", "3",
                      "--max-tokens", "4", *threads])  # fmt: skip
    assert run["output_tokens"] == 12 and 0 < run["sampler_share"] < 1
    assert Sampler.sample_ids is sample_ids  # unpatched again
