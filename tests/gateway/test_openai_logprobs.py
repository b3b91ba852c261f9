"""Logprob tokens by their own text in OpenAI's shapes (issue 20): ``token``, ``bytes`` and a
completion's ``text_offset`` across a stream's chunks, checked against the SDK's types."""

from __future__ import annotations

from openai.types.chat import ChatCompletion

from gateway.openai_chunks import ChunkWriter
from gateway.openai_logprobs import LogprobsByChoice
from gateway.openai_stream import Shape
from producer import JobResult
from producer.protocol import TokenEvent, TokenLogprob, TopLogprob
from producer.status import FinishReason
from tests.gateway.test_tools import _done

# "é" split over two tokens (as a byte-level vocabulary does), then " ok".
C3 = TopLogprob(token_id=5, logprob=-0.1, text="\\xc3", token_bytes=(0xC3,))
E1 = TokenLogprob(**C3.model_dump(), rank=1, top=(C3,))
E2 = TokenLogprob(token_id=6, logprob=-0.2, rank=1, text="\\xa9", token_bytes=(0xA9,))
OK = TokenLogprob(token_id=7, logprob=-0.3, rank=2, text=" ok",
                  top=(TopLogprob(token_id=8, logprob=-0.2, text=" no"),))  # fmt: skip


def _event(index: int, text: str, *lps: TokenLogprob) -> TokenEvent:
    ids = tuple(lp.token_id for lp in lps)
    return TokenEvent(choice=0, index=index, text=text, token_ids=ids, logprobs=lps)


EVENTS = [_event(0, "", E1), _event(1, "é ok", E2, OK)]


def test_chat_names_tokens_by_text_with_their_bytes() -> None:
    shape = Shape("job1", "m", True, logprobs=True)
    result, logprobs = JobResult("job1"), LogprobsByChoice()
    for event in EVENTS:
        result.apply(event)
        logprobs.add(event)
    result.apply(_done(FinishReason.LENGTH))
    body = ChatCompletion.model_validate(shape.whole(result, logprobs))
    content = body.choices[0].logprobs.content  # type: ignore[union-attr]
    assert [t.token for t in content] == ["\\xc3", "\\xa9", " ok"]  # type: ignore[union-attr]
    assert [t.bytes for t in content] == [[0xC3], [0xA9], list(b" ok")]  # type: ignore[union-attr]
    assert bytes(b for t in content for b in t.bytes or ()).decode() == "é ok"  # type: ignore[union-attr]
    assert [(t.token, t.bytes) for t in content[2].top_logprobs] == [(" no", list(b" no"))]  # type: ignore[index]


def test_completion_text_offsets_go_on_across_chunks() -> None:
    shape = Shape("job1", "m", False, logprobs=True)
    writer = ChunkWriter(shape)
    offsets: list[int] = []
    for event in EVENTS:
        for chunk in writer.chunks(event):
            logprobs = chunk["choices"][0]["logprobs"]  # a chunk: finish_reason null
            offsets += (logprobs or {}).get("text_offset") or []
    # "é" starts at 0 whichever of its two tokens; " ok" at 1, after the one character.
    assert offsets == [0, 0, 1]


def test_a_worker_that_sends_ids_only_gives_id_names() -> None:
    shape = Shape("job1", "m", False, logprobs=True)
    body = shape.choice(0, {"text": "x"}, "stop", [TokenLogprob(token_id=3, logprob=-1, rank=1)])
    assert body["logprobs"]["tokens"] == ["token_id:3"] and body["logprobs"]["text_offset"] is None
