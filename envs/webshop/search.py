"""The search engine: Okapi BM25 over each product's title, attributes, features, query and option values
(WebShop ranks with Pyserini's BM25 over the product text and shows the top 50)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np

from envs.webshop.reward import tokens

K1, B = 1.5, 0.75


class SearchIndex:
    """An inverted index over documents (strings) holding each posting's BM25 term weight; `search` returns
    document numbers, best first."""

    def __init__(self, documents: list[str]) -> None:
        counts = [Counter(tokens(document)) for document in documents]
        lengths = np.array([sum(c.values()) for c in counts], dtype=float)
        norms = K1 * (1 - B + B * lengths / max(float(lengths.mean()) if len(lengths) else 0.0, 1e-9))
        postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for number, document_counts in enumerate(counts):
            for token, count in document_counts.items():
                postings[token].append((number, count))
        self.size = len(documents)
        self.postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for token, pairs in postings.items():
            numbers = np.array([n for n, _ in pairs])
            tf = np.array([c for _, c in pairs], dtype=float)
            idf = math.log(1 + (self.size - len(pairs) + 0.5) / (len(pairs) + 0.5))
            self.postings[token] = (numbers, idf * tf * (K1 + 1) / (tf + norms[numbers]))

    def search(self, query: str, limit: int) -> list[int]:
        """The `limit` best documents for `query` (ties by document number); [] when no query word is known."""
        scores = np.zeros(self.size)
        for token in set(tokens(query)):
            if token in self.postings:
                numbers, weights = self.postings[token]
                scores[numbers] += weights
        found = np.flatnonzero(scores > 0)
        order = np.lexsort((found, -scores[found]))  # by score, descending, then by document number
        return found[order[:limit]].tolist()
