"""Loader for HotpotQA records: the JSON list of the official files (`context` as `[[title, [sentences]], ...]`,
`supporting_facts` as `[[title, sentence_index], ...]`) or JSONL, also in the column layout of the Hugging Face
copy (`context: {title: [...], sentences: [[...]]}`, `supporting_facts: {title: [...], sent_id: [...]}`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from envs.searchqa.corpus import Corpus, Passage
from orchlib.errors import OrchError, choices_error

SUFFIXES = (".json", ".jsonl")


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answer: str
    passages: tuple[Passage, ...]  # the record's context paragraphs
    supporting_facts: tuple[tuple[str, int], ...]  # (title, sentence index), in the record's order
    kind: str = ""  # HotpotQA's `type`: bridge or comparison

    @property
    def hops(self) -> list[str]:
        """The supporting titles in order of first appearance: what a gold trajectory searches for."""
        return list(dict.fromkeys(title for title, _ in self.supporting_facts))

    def supporting_sentences(self, title: str) -> list[str]:
        passage = next((p for p in self.passages if p.title == title), None)
        if passage is None:
            return []
        indices = [i for t, i in self.supporting_facts if t == title and 0 <= i < len(passage.sentences)]
        return [passage.sentences[i].strip() for i in indices]

    @cached_property
    def corpus(self) -> Corpus:
        return Corpus(self.passages)


@dataclass(frozen=True)
class QuestionSet:
    questions: tuple[Question, ...]

    @cached_property
    def shared_corpus(self) -> Corpus:
        """Every record's paragraphs in one corpus, one passage per title (the first seen)."""
        by_title: dict[str, Passage] = {}
        for question in self.questions:
            for passage in question.passages:
                by_title.setdefault(passage.title, passage)
        return Corpus(tuple(by_title.values()))


def _columns(value: Any, keys: tuple[str, str]) -> list[list[Any]]:
    """`[[a, b], ...]` from either that list or the column dict `{keys[0]: [a...], keys[1]: [b...]}`."""
    if isinstance(value, dict):
        return [list(pair) for pair in zip(value.get(keys[0], []), value.get(keys[1], []), strict=False)]
    return value if isinstance(value, list) else []


def parse_record(record: Any, index: int = 0) -> Question | None:
    """A HotpotQA record as a Question; None when it lacks a question, an answer or a searchable paragraph."""
    if not isinstance(record, dict):
        return None
    question, answer = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not isinstance(answer, str) or not question.strip() or not answer.strip():
        return None
    passages = []
    for item in _columns(record.get("context"), ("title", "sentences")):
        if len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], list):
            sentences = tuple(s for s in item[1] if isinstance(s, str))
            if "".join(sentences).strip():
                passages.append(Passage(item[0], sentences))
    if not passages:
        return None
    facts = tuple(
        (item[0], int(item[1]))
        for item in _columns(record.get("supporting_facts"), ("title", "sent_id"))
        if len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], int)
    )
    return Question(
        id=str(record.get("_id", record.get("id", index))),
        question=question.strip(),
        answer=answer.strip(),
        passages=tuple(passages),
        supporting_facts=facts,
        kind=str(record.get("type", "")),
    )


def parse_records(records: list[Any], where: str) -> QuestionSet:
    questions = tuple(q for i, record in enumerate(records) if (q := parse_record(record, i)) is not None)
    if not questions:
        raise OrchError(f"{where}: no record has 'question', 'answer' and a 'context' paragraph")
    return QuestionSet(questions)


@lru_cache(maxsize=4)
def load_questions(path: str, max_instances: int | None = None) -> QuestionSet:
    """The usable records among the first `max_instances` (None: all) of the HotpotQA file `path`, in file order.
    Raises OrchError for a missing or unreadable file, an unknown suffix, or a file with no usable record."""
    file = Path(path)
    where = f"searchqa data_path {path}"
    if file.suffix not in SUFFIXES:
        raise choices_error("data file suffix", file.suffix, list(SUFFIXES), where=where)
    if not file.is_file():
        raise OrchError(f"searchqa data_path: no such file {path}")
    try:
        text = file.read_text(encoding="utf-8")
        if file.suffix == ".jsonl":
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            records = json.loads(text)
    except (ValueError, OSError) as err:
        raise OrchError(f"{where}: cannot read records ({err.__class__.__name__}: {err})") from None
    if not isinstance(records, list):
        raise OrchError(f"{where}: expected a JSON list of HotpotQA records")
    return parse_records(records if max_instances is None else records[:max_instances], where)
