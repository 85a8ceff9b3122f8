"""Answer scoring of the HotpotQA / SQuAD evaluation: exact match and token F1 after normalisation (lower case,
no punctuation, no articles a/an/the, single spaces)."""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# HotpotQA scores a yes/no/noanswer reply 0 unless it is exactly the gold one.
_CLOSED = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """Lower case, punctuation removed, articles removed, whitespace collapsed."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_score(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall of the normalised answers; 0 when either is empty."""
    predicted, expected = normalize_answer(prediction), normalize_answer(gold)
    if (predicted in _CLOSED or expected in _CLOSED) and predicted != expected:
        return 0.0
    predicted_tokens, expected_tokens = predicted.split(), expected.split()
    common = sum((Counter(predicted_tokens) & Counter(expected_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted_tokens), common / len(expected_tokens)
    return 2 * precision * recall / (precision + recall)
