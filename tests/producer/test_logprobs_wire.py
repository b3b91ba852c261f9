"""The logprob entries' token text on the wire (issue 20): additive, so old events still read."""

from __future__ import annotations

from producer.protocol import TokenEvent, TokenLogprob, event_fields, parse_event


def test_an_event_from_a_worker_before_the_text_reads_as_ids_only() -> None:
    data = '{"type":"token","choice":0,"index":0,"text":"a","token_ids":[7],'
    data += '"logprobs":[{"token_id":7,"logprob":-0.5,"rank":1,"top":[]}]}'
    event = parse_event("1-0", {"type": "token", "data": data})
    assert isinstance(event, TokenEvent) and event.logprobs is not None
    (lp,) = event.logprobs
    assert (lp.text, lp.token_bytes, lp.utf8_bytes()) == (None, None, None)


def test_text_and_partial_bytes_round_trip_and_nulls_stay_off_the_wire() -> None:
    whole = TokenLogprob(token_id=7, logprob=-0.5, rank=1, text=" é")
    part = TokenLogprob(token_id=8, logprob=-0.7, rank=2, text="\\xc3", token_bytes=(0xC3,))
    event = TokenEvent(choice=0, index=0, text=" é", token_ids=(7, 8), logprobs=(whole, part))
    fields = event_fields(event)
    assert "token_bytes" not in fields["data"].split('"token_id":8')[0]  # null: left out
    read = parse_event("1-0", fields)
    assert isinstance(read, TokenEvent) and read.logprobs == (whole, part)
    assert whole.utf8_bytes() == list(" é".encode()) and part.utf8_bytes() == [0xC3]
