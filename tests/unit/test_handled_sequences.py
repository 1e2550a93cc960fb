"""The stream sequences a consumer handled, kept as ranges: they answer as the set of every sequence handled would,
within the span of the newest, in whatever order they were handled."""

from hypothesis import given
from hypothesis import strategies as st

from chamber.common.bus.handled import HandledSequences


@given(st.lists(st.integers(1, 400), max_size=300), st.integers(1, 500))
def test_the_ranges_answer_as_the_set_of_sequences_handled_within_the_span(seqs: list[int], span: int) -> None:
    handled = HandledSequences(span)
    seen: set[int] = set()
    for seq in seqs:
        handled.add(seq)
        seen.add(seq)
        newest = max(seen)
        for probe in range(402):
            if probe >= newest - span:
                assert (probe in handled) == (probe in seen), (probe, newest)
            else:
                assert probe not in handled, "older than the span: forgotten"


def test_sequences_handled_in_order_are_one_range() -> None:
    handled = HandledSequences(1_000_000)
    for seq in range(1, 100_001):
        handled.add(seq)
    assert len(handled) == 1
    assert 1 in handled
    assert 100_000 in handled
    assert 100_001 not in handled
    handled.add(100_003)  # 100,001 and 100,002 failed and wait for their redelivery
    assert len(handled) == 2
    handled.add(100_002)
    handled.add(100_001)
    assert len(handled) == 1
