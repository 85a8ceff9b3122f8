"""Passages and the BM25 retriever over one corpus (the `bm25s` library). The index is built on the first search
and kept with the corpus, so each corpus is indexed once per process."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Passage:
    """One paragraph: an article title and its sentences (HotpotQA's `[title, [sentences]]`)."""

    title: str
    sentences: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join(sentence.strip() for sentence in self.sentences)


class Corpus:
    """The passages one question can search. `search(query, k)` returns up to `k` passages that share a term
    with the query, best BM25 score first (the title counts as part of the passage)."""

    def __init__(self, passages: tuple[Passage, ...]) -> None:
        self.passages = passages
        self._index = None

    def __len__(self) -> int:
        return len(self.passages)

    def _build(self):
        import logging

        import bm25s
        from bm25s.tokenization import Tokenizer

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG

        tokenizer = Tokenizer(stopwords="en")
        ids = tokenizer.tokenize(
            [f"{p.title}. {p.text}" for p in self.passages], return_as="ids", show_progress=False
        )
        retriever = bm25s.BM25()
        retriever.index(ids, show_progress=False)
        return tokenizer, retriever

    def search(self, query: str, k: int) -> list[Passage]:
        if self._index is None:
            self._index = self._build()
        tokenizer, retriever = self._index
        ids = tokenizer.tokenize([query], update_vocab=False, return_as="ids", show_progress=False)
        docs, scores = retriever.retrieve(
            ids, k=min(k, len(self.passages)), show_progress=False, n_threads=1
        )
        return [self.passages[doc] for doc, score in zip(docs[0], scores[0], strict=True) if score > 0]
