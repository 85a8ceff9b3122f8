"""The SearchQA environment: answer a multi-hop question by searching a corpus with BM25 and finishing with an
answer; reward = token F1 of the answer against the gold one (exact match logged), 0 without a finish."""

from __future__ import annotations

import random
import re
from functools import lru_cache
from typing import Any, Literal

from pydantic import Field

from envs.base import DataSource, Env, EnvConfig, reject_options
from envs.registry import register_env
from envs.searchqa.answers import exact_match, f1_score
from envs.searchqa.corpus import Corpus, Passage
from envs.searchqa.dataset import Question, QuestionSet, load_questions, parse_records
from envs.searchqa.encyclopedia import generate_records
from envs.split import record_index

_ACTION = re.compile(r"(search|finish)\[(.*)\]", re.IGNORECASE | re.DOTALL)


@lru_cache(maxsize=1)
def generated_questions() -> QuestionSet:
    """The shipped set: the generated encyclopedia's two-hop questions (built once per process)."""
    return parse_records(generate_records(), "searchqa generated set")


def parse_action(action: str) -> tuple[str, str] | None:
    """('search', query) or ('finish', answer) from `search[...]` / `finish[...]` (any case); None otherwise."""
    match = _ACTION.fullmatch(action.strip())
    if match is None or not match.group(2).strip():
        return None
    return match.group(1).lower(), match.group(2).strip()


class SearchQAConfig(EnvConfig):
    max_turns: int = Field(5, ge=1, description="Turns per episode: one action each.")
    max_actions_per_turn: int = Field(1, ge=1, description="Actions read from one reply.")
    max_actions: int = Field(5, ge=1, description="Searches and the finish, per episode.")
    top_k: int = Field(3, ge=1, description="Passages returned by one search.")
    corpus: Literal["question", "all"] = Field(
        "question",
        description="What a search sees: the question's own context paragraphs (HotpotQA distractor setting), "
        "or every paragraph of the data set (one passage per title).",
    )
    data_path: str | None = Field(
        None, description="HotpotQA file (.json list or .jsonl); question: a training record; evaluation seeds play the held-out 10% (envs.split). None: generated."
    )
    max_instances: int | None = Field(
        None, ge=1, description="Records of data_path read, from its start (RAGEN's max_instances, 20,000: "
        "ragen/env/search/config.py:22); None: all."
    )
    f1_threshold: float | None = Field(
        None, gt=0, le=1, description="RAGEN's reward rule (ragen/env/search/reward.py:165,190-196; 0.3 in "
        "ragen/env/search/config.py:38): an exact answer earns 1, an answer with F1 >= this earns its F1, any other "
        "0; success = such an answer (ragen/env/search/env.py:181). None: the reward is the F1 and success the "
        "exact match.",
    )


@register_env("searchqa")
class SearchQAEnv(Env):
    """Answer a multi-hop question: search[query] a corpus (BM25), then finish[answer]; reward = answer F1."""

    data = DataSource("data_path", "HotpotQA JSON/JSONL/Parquet, its paragraphs as the corpus",
                      "the generated encyclopedia's 300 questions")

    config_class = SearchQAConfig
    valid_actions = None
    answer_format = "search[query] or finish[answer]"

    question: Question
    corpus: Corpus
    queries: list[str]
    results: list[Passage]
    note: str  # what the last action did, shown under the results

    @property
    def instruction(self) -> str:
        return (
            "You are answering a question that needs facts from several encyclopedia articles. Each turn give one "
            f"action: search[query] returns the {self.config.top_k} best-matching passages, finish[answer] ends "
            "the episode with your answer (a short phrase). "
            f"You have {self.config.max_actions} actions. Reward: {self._reward_rule()}, 0 without a finish."
        )

    def _reward_rule(self) -> str:
        threshold = self.config.f1_threshold
        if threshold is None:
            return "the F1 overlap of your answer with the correct one"
        return (f"1 for the exact answer, else the F1 overlap of your answer with the correct one when it is at "
                f"least {threshold:g}, else 0")

    def _questions(self) -> QuestionSet:
        if self.config.data_path is None:
            return generated_questions()
        return load_questions(self.config.data_path, self.config.max_instances)

    def _reset(self, rng: random.Random, options: dict[str, Any]) -> None:
        reject_options(self, options, ())
        questions = self._questions()
        self.question = questions.questions[record_index(self.seed, len(questions.questions))]
        self.corpus = questions.shared_corpus if self.config.corpus == "all" else self.question.corpus
        self.queries, self.results, self.note = [], [], ""

    def _step(self, action: str) -> tuple[float, bool, dict[str, Any]]:
        parsed = parse_action(action)
        if parsed is None:
            self.note = "Invalid action: use search[query] or finish[answer] with a non-empty argument."
            return 0.0, False, {"action_valid": False}
        verb, argument = parsed
        if verb == "search":
            self.queries.append(argument)
            self.results = self.corpus.search(argument, self.config.top_k)
            self.note = ""
            return 0.0, False, {"query": argument, "results": [p.title for p in self.results]}
        f1, em = f1_score(argument, self.question.answer), exact_match(argument, self.question.answer)
        self.note = f"You answered: {argument}"
        reward, success = f1, em
        if self.config.f1_threshold is not None:  # RAGEN's rule (see SearchQAConfig.f1_threshold)
            success = em or f1 >= self.config.f1_threshold
            reward = 1.0 if em else f1 if success else 0.0
        return reward, True, {"f1": f1, "em": float(em), "success": success, "answer": argument}

    def render_text(self) -> str:
        lines = [f"Question: {self.question.question}"]
        if self.queries:
            lines.append(f'Search results for "{self.queries[-1]}":')
            lines += [f"[{i}] {p.title}: {p.text}" for i, p in enumerate(self.results, 1)] or ["(no passage matches)"]
        else:
            lines.append("No search yet.")
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def demonstrate(self, rng: random.Random) -> tuple[str, list[str]]:
        """The gold trajectory: search each supporting article's title in turn (reading the fact that leads to
        the next, e.g. the bridge entity), then finish with the gold answer."""
        hops, searched = self.question.hops, {q.lower() for q in self.queries}
        facts = []
        if self.queries:
            shown = {p.title for p in self.results}
            last = next((t for t in hops if t.lower() == self.queries[-1].lower()), None)
            if last in shown:
                facts = self.question.supporting_sentences(last)
        parts = [f'The passage on {self.queries[-1]} says: "{fact}"' for fact in facts]
        remaining = [title for title in hops if title.lower() not in searched]
        if remaining:
            if not self.queries:
                parts.insert(0, f"The question asks: {self.question.question}")
            opening = rng.choice(["I need to look up", "Next I search for", "The next article to read is"])
            parts.append(f"{opening} {remaining[0]}.")
            return " ".join(parts), [f"search[{remaining[0]}]"]
        closing = rng.choice(["So the answer is", "That gives the answer", "Therefore the answer is"])
        parts.append(f"{closing} {self.question.answer}.")
        return " ".join(parts), [f"finish[{self.question.answer}]"]
