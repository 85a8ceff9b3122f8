"""SearchQA: answer F1/EM, the BM25 retriever, the HotpotQA loader, the generated set and its solver, and the
search[...] / finish[...] actions through the chat protocol."""

from __future__ import annotations

import json
import random

import pytest

from envs import demonstrations, make_env
from envs.episode import Episode
from envs.protocol import format_response
from envs.searchqa.answers import exact_match, f1_score, normalize_answer
from envs.searchqa.dataset import load_questions
from envs.searchqa.encyclopedia import generate_records
from envs.searchqa.env import generated_questions, parse_action
from orchlib.errors import OrchError

RECORDS = [
    {
        "_id": "a1",
        "question": "Which river flows through the birthplace of Ada Quill?",
        "answer": "the Orne River",
        "type": "bridge",
        "supporting_facts": [["Ada Quill", 1], ["Caen", 0]],
        "context": [
            ["Ada Quill", ["Ada Quill is a poet.", " She was born in Caen."]],
            ["Caen", ["Caen lies on the Orne River.", " It is in Normandy."]],
            ["Rouen", ["Rouen lies on the Seine."]],
        ],
    },
    {"question": "No answer (test split).", "context": [["T", ["x y"]]]},
    {"question": "No paragraph.", "answer": "x", "context": []},
    {
        "id": "b2",
        "question": "Were Ada Quill and Bo Lind both poets?",
        "answer": "yes",
        "type": "comparison",
        "supporting_facts": {"title": ["Ada Quill", "Bo Lind"], "sent_id": [0, 0]},
        "context": {
            "title": ["Bo Lind", "Ada Quill"],
            "sentences": [["Bo Lind is a poet from Oslo."], ["Ada Quill is a poet."]],
        },
    },
]


@pytest.mark.parametrize(
    ("prediction", "gold", "f1", "em"),
    [
        ("Paris", "paris", 1.0, True),
        ("The Eiffel Tower!", "eiffel tower", 1.0, True),  # article and punctuation dropped
        ("an apple", "A  apple.", 1.0, True),
        ("Orne", "the Orne River", 2 * (1 * 0.5) / 1.5, False),  # precision 1, recall 1/2
        ("Orne River in Caen", "Orne River", 2 * (0.5 * 1) / 1.5, False),  # precision 1/2, recall 1
        ("river river", "river", 2 * (0.5 * 1) / 1.5, False),  # repeated tokens count once per gold token
        ("London", "Paris", 0.0, False),
        ("", "Paris", 0.0, False),
        ("the", "a", 0.0, True),  # both empty after normalisation: equal, but no token overlap
        ("no", "yes", 0.0, False),
        ("yes it is", "yes", 0.0, False),  # a yes/no gold scores only exactly
        ("1,923", "1923", 1.0, True),
    ],
)
def test_f1_and_exact_match(prediction, gold, f1, em):
    assert f1_score(prediction, gold) == pytest.approx(f1)
    assert exact_match(prediction, gold) is em


def test_normalisation_keeps_words_containing_articles():
    assert normalize_answer("The Theatre of Anatolia, a play") == "theatre of anatolia play"


@pytest.mark.parametrize(
    ("action", "parsed"),
    [
        ("search[Ada Quill]", ("search", "Ada Quill")),
        (" SEARCH[ Ada ] ", ("search", "Ada")),
        ("finish[the Orne [river]]", ("finish", "the Orne [river]")),
        ("Finish[yes]", ("finish", "yes")),
        ("search[]", None),
        ("finish[   ]", None),
        ("lookup[Ada]", None),
        ("search Ada", None),
        ("search[Ada] please", None),
        ("Paris", None),
    ],
)
def test_parse_action(action, parsed):
    assert parse_action(action) == parsed


def write_records(tmp_path, suffix=".json", records=RECORDS):
    path = tmp_path / f"hotpot{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    else:
        path.write_text(json.dumps(records))
    return str(path)


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_loader_reads_both_hotpotqa_layouts_and_skips_unusable_records(tmp_path, suffix):
    questions = load_questions(write_records(tmp_path, suffix)).questions
    assert [q.id for q in questions] == ["a1", "b2"]
    first, second = questions
    assert first.answer == "the Orne River" and first.kind == "bridge"
    assert first.hops == ["Ada Quill", "Caen"]
    assert first.supporting_sentences("Ada Quill") == ["She was born in Caen."]
    assert [p.title for p in first.passages] == ["Ada Quill", "Caen", "Rouen"]
    assert first.passages[0].text == "Ada Quill is a poet. She was born in Caen."
    assert [p.title for p in second.passages] == ["Bo Lind", "Ada Quill"]  # the column layout
    assert second.supporting_facts == (("Ada Quill", 0), ("Bo Lind", 0))


def test_generated_set_round_trips_through_a_hotpotqa_file(tmp_path):
    path = write_records(tmp_path, records=generate_records())
    assert load_questions(path) == generated_questions()
    assert generate_records() == generate_records()  # deterministic
    assert generate_records(seed=1) != generate_records()


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(OrchError, match="valid choices: .json, .jsonl"):
        load_questions(str(tmp_path / "hotpot.csv"))
    with pytest.raises(OrchError, match="no such file"):
        load_questions(str(tmp_path / "missing.json"))
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    with pytest.raises(OrchError, match="cannot read"):
        load_questions(str(broken))
    with pytest.raises(OrchError, match="no record has"):
        load_questions(write_records(tmp_path, records=RECORDS[1:3]))


def test_retriever_returns_the_gold_passage_for_the_gold_query():
    questions = generated_questions()
    for question in questions.questions:
        for title in question.hops:
            assert question.corpus.search(title, 3)[0].title == title
            assert questions.shared_corpus.search(title, 3)[0].title == title
        # the first hop's supporting sentence names the bridge entity: a reader can find the second hop
        assert question.hops[1] in " ".join(question.supporting_sentences(question.hops[0]))


def test_retriever_ranks_and_leaves_out_unrelated_passages(tmp_path):
    corpus = load_questions(write_records(tmp_path)).questions[0].corpus
    assert [p.title for p in corpus.search("which river is Caen on", 3)] == ["Caen", "Ada Quill"]
    assert corpus.search("Seine", 1)[0].title == "Rouen"
    assert corpus.search("zzz unknown words", 3) == []
    assert len(corpus.search("lies", 10)) == 2  # k beyond the corpus size


def test_episode_on_loaded_records_searches_and_scores_f1(tmp_path):
    env = make_env("searchqa", data_path=write_records(tmp_path), top_k=2)
    state, _ = env.reset(seed=2)  # record 2 % 2 usable = the first
    assert "birthplace of Ada Quill" in state and "No search yet." in state
    state, reward, terminated, truncated, info = env.step("search[Ada Quill]")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["results"] == ["Ada Quill"] and "[1] Ada Quill: Ada Quill is a poet. She was born in Caen." in state
    state, reward, terminated, _, info = env.step("finish[Orne]")
    assert terminated and reward == pytest.approx(2 / 3)
    assert (info["f1"], info["em"], info["success"]) == (reward, 0.0, False)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("finish[Orne River.]")
    assert (reward, info["em"], info["success"]) == (1.0, 1.0, True)


@pytest.mark.parametrize(("threshold", "answer", "reward", "success"), [
    (0.3, "Orne", 2 / 3, True),  # F1 2/3 >= 0.3: the F1, a success (RAGEN reward.py:165,190-196, env.py:181)
    (0.7, "Orne", 0.0, False),  # below the threshold: nothing
    (0.3, "Orne River.", 1.0, True),  # exact: 1
    (0.3, "Paris", 0.0, False),
])
def test_ragens_reward_rule_with_an_f1_threshold(tmp_path, threshold, answer, reward, success):
    env = make_env("searchqa", data_path=write_records(tmp_path), f1_threshold=threshold)
    env.reset(seed=0)
    _, got, terminated, _, info = env.step(f"finish[{answer}]")
    assert terminated and got == pytest.approx(reward) and info["success"] is success
    assert "at least" in env.instruction


def test_max_instances_reads_the_first_records_only(tmp_path):
    path = write_records(tmp_path)
    assert len(load_questions(path, 1).questions) <= 1 < len(load_questions(path).questions)


def test_corpus_all_searches_every_record(tmp_path):
    path = write_records(tmp_path)
    alone, pooled = make_env("searchqa", data_path=path), make_env("searchqa", data_path=path, corpus="all")
    for env in (alone, pooled):
        env.reset(seed=1)  # the comparison question: Ada Quill and Bo Lind only
    assert alone.step("search[Caen Rouen]")[4]["results"] == []
    assert {"Caen", "Rouen"} <= set(pooled.step("search[Caen Rouen]")[4]["results"])


def test_no_finish_earns_nothing_and_bad_actions_cost_the_format_penalty():
    env = make_env("searchqa", max_actions=2)
    episode = Episode(env, seed=4)
    turn = episode.act(format_response("guess", ["lookup[something]"]))
    assert turn.info["failure"] == "invalid_action" and turn.reward == pytest.approx(-0.1)
    assert "Invalid action" in episode.messages[-1]["content"]
    turn = episode.act(format_response("two at once", ["search[a]", "finish[b]"]))  # one action per turn
    assert turn.actions == ["search[a]"] and turn.info["extra_actions"] == 1 and turn.format_valid
    assert episode.done and turn.info["env"][-1].get("f1") is None
    trajectory = episode.trajectory()
    assert (trajectory.episode_return, trajectory.success) == (pytest.approx(-0.1), False)
    assert episode.env.finished and not episode.turns[0].format_valid


def test_unparsable_reply_is_charged_without_spending_an_action():
    episode = Episode(make_env("searchqa"), seed=0)
    turn = episode.act("search[anything]")
    assert turn.info["failure"] == "missing_think" and turn.reward == pytest.approx(-0.1)
    assert episode.env.actions_left == 5


def test_solver_succeeds_on_every_generated_question():
    env = make_env("searchqa")
    count = len(generated_questions().questions)
    assert count == 300
    rng = random.Random(0)
    for seed in range(count):
        episode = Episode(env, seed)
        while not episode.done:
            episode.act(format_response(*env.demonstrate(rng)))
        trajectory = episode.trajectory()
        assert trajectory.success and trajectory.episode_return == 1.0, seed
        assert [len(t.actions) for t in trajectory.turns] == [1, 1, 1]


def test_demonstrations_quote_the_passage_that_names_the_next_search():
    for transcript in demonstrations("searchqa", 5, seed=2):
        replies = [m["content"] for m in transcript if m["role"] == "assistant"]
        states = [m["content"] for m in transcript if m["role"] == "user"]
        assert len(replies) == 3 and "search[" in replies[0] and "finish[" in replies[2]
        bridge = replies[1].split("search[")[1].split("]")[0]
        quoted = replies[1].split('says: "')[1].split('"')[0]
        assert bridge in quoted and quoted in states[1]  # read from the results on screen
