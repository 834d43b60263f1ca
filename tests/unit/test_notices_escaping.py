"""What a run's author, its code or its caller wrote reaches the team's chat as text, never as markup: a training
job's FailureReason, a spec's name (an inline spec's, or a refused spec's key), a stop's cause, an error's cause
and metrics' names are escaped and quoted in Slack's mrkdwn and top-level text, sit only in Teams' TextRuns
(which Adaptive Cards never read as Markdown), and stay plain JSON strings; only the stack's own console link is
a link."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from lustrain_core.config import Settings
from lustrain_core.steps import notices
from lustrain_core.steps.records import JobRecord

#: a link in Slack's and in Markdown's syntax, mentions, formatting, HTML, and a backticked Slack link (which
#: would end a code span it is put in and be read as a link)
EVIL = (
    "see <https://evil.example/a|click> or [click](https://evil.example/b) <!channel> <!here> <@U123> "
    "*urgent* _now_ ~gone~ <b>bold</b> & `<https://evil.example/c|tick>`\n> quoted"
)
SETTINGS = Settings(region="eu-west-1", stack_name="lustrain-test")
JOB = "tiny-0123abcd"
CONSOLE = "https://eu-west-1.console.aws.amazon.com/sagemaker/home?region=eu-west-1#/jobs/tiny-0123abcd-1"


def failure_reason() -> notices.Notice:
    """A training job failed with a FailureReason its own code wrote (notify's `why`: the class, the reason)."""
    return notices.attempt_ended(
        JobRecord(job_id=JOB),
        training_job=f"{JOB}-1",
        attempt=1,
        status="Failed",
        why=f"AlgorithmError: {EVIL}",
        cost=1.5,
        model=f"s3://lustrain-artifacts/archive/{JOB}/",
        settings=SETTINGS,
    )


def inline_spec_name() -> notices.Notice:
    """An execution started with an inline spec: its name is the caller's (notify's _started_from)."""
    return notices.started("run-1", f"inline spec {EVIL!r}", SETTINGS)


def cancel_cause() -> notices.Notice:
    """A stop's cause is whatever StopExecution's caller wrote."""
    return notices.stopped("cancelled", JobRecord(job_id=JOB, execution="run-1"), EVIL, 2.0, None, SETTINGS)


def refused_spec() -> notices.Notice:
    """A spec refused at registration is named by its key; the refusal's cause and the metrics' names are the
    spec's and the job's."""
    facts = {
        "job_id": f"the spec s3://jobs/{EVIL}.yaml",
        "outcome": "refused",
        "error": "SpecInvalid",
        "cause": EVIL,
        "metrics": {EVIL: 0.5},
        "archive_s3_uri": f"s3://jobs/{EVIL}/",
    }
    return notices.ended(facts, None, SETTINGS)


NOTICES = [failure_reason, inline_spec_name, cancel_cause, refused_spec]


def slack_fields(body: dict[str, Any]) -> list[str]:
    """Every text Slack reads as mrkdwn: the top-level text (what notifications show) and each block's."""
    fields = [body["text"]]
    for block in body["blocks"]:
        if "text" in block:
            assert block["text"]["type"] == "mrkdwn"
            fields.append(block["text"]["text"])
        fields += [element["text"] for element in block.get("elements", [])]
    return fields


def outside_code_spans(text: str) -> str:
    return re.sub(r"`[^`\n]*`", "", text)


@pytest.mark.parametrize("make", NOTICES)
def test_slack_escapes_and_quotes_what_the_run_wrote_in_its_text_and_every_mrkdwn_field(make):
    body = make().body("slack")
    for text in slack_fields(body):
        # Slack's control characters escaped: no link, no mention, no HTML is read
        for markup in ("<https://evil", "<!channel>", "<!here>", "<@U123>", "<b>", "& "):
            assert markup not in text, (markup, text)
        # and the words are quoted: every bit of them inside a code span (the backticked link in them did not
        # end it), so that no *bold*, _italic_, bare URL nor `> quote` is read either
        assert "evil.example" not in outside_code_spans(text), text
        assert "urgent" not in outside_code_spans(text) and "quoted" not in outside_code_spans(text)
    assert "&lt;https://evil.example/a|click&gt;" in body["text"]
    assert "&lt;https://evil.example/a|click&gt;" in body["blocks"][0]["text"]["text"]
    assert "&lt;!channel&gt;" in body["text"] and "&amp;" in body["text"]
    # the backticks the run wrote are shown as another character, the span goes on
    assert "\u02cb&lt;https://evil.example/c|tick&gt;\u02cb" in body["text"]


def test_slack_shows_the_stacks_own_console_link_as_a_link():
    body = failure_reason().body("slack")
    link = f"<{CONSOLE}|The training job in the SageMaker console>"
    assert link in body["blocks"][0]["text"]["text"] and link in body["text"]
    # the only link in the message
    assert re.findall(r"<(https://[^|>]+)\|", "\n".join(slack_fields(body))) == [CONSOLE, CONSOLE]


def test_slack_quotes_a_long_reason_on_one_line_and_cut():
    notice = notices.attempt_ended(
        JobRecord(job_id=JOB),
        training_job=f"{JOB}-1",
        attempt=1,
        status="Failed",
        why="AlgorithmError: " + "x\n" * 5000 + EVIL,
        cost=None,
        model=None,
        settings=SETTINGS,
    )
    section = notice.body("slack")["blocks"][0]["text"]["text"]
    why = next(line for line in section.split("\n") if line.startswith("Why: "))
    assert why.startswith("Why: `AlgorithmError: x x x") and why.endswith("…`")
    assert len(why) < notices.MAX_QUOTED + 20 and "evil" not in section


def markdown_texts(node: Any) -> list[str]:
    """Every text of a card that Adaptive Cards read as Markdown: anything but a TextRun's (TextBlock's text, a
    Fact's title and value, ...), and the text of the actions (their titles are the stack's)."""
    found: list[str] = []
    if isinstance(node, dict):
        if node.get("type") != "TextRun":
            found += [v for k, v in node.items() if k in ("text", "title", "value") and isinstance(v, str)]
        for value in node.values():
            found += markdown_texts(value) if node.get("type") != "TextRun" else []
    elif isinstance(node, list):
        for value in node:
            found += markdown_texts(value)
    return found


def text_runs(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        if node.get("type") == "TextRun":
            return [node]
        return [run for value in node.values() for run in text_runs(value)]
    if isinstance(node, list):
        return [run for value in node for run in text_runs(value)]
    return []


@pytest.mark.parametrize("make", NOTICES)
def test_teams_puts_what_the_run_wrote_in_monospace_text_runs_only(make):
    body = make().body("teams")
    card = body["attachments"][0]["content"]
    # no Markdown field holds any of it (a TextBlock's or a Fact's [click](https://...) is a link)
    assert not [t for t in markdown_texts(card) if "evil" in t or "click" in t or "urgent" in t]
    quoted = [run for run in text_runs(card) if "evil.example" in run["text"]]
    assert quoted and all(run.get("fontType") == "Monospace" for run in quoted)
    # a renderer that wrongly reads Markdown or HTML in a TextRun finds no link and no tag either
    posted = json.dumps(body, ensure_ascii=False)
    assert "[click](" not in posted and "<https://evil" not in posted and "<b>" not in posted
    # the words read as the run wrote them (the zero-width spaces that break `](` and `<` show as nothing)
    shown = "".join(run["text"] for run in text_runs(card)).replace("\u200b", "")
    assert "[click](https://evil.example/b) <!channel>" in shown and "<b>bold</b>" in shown


def test_teams_shows_the_stacks_own_console_link_as_its_action():
    card = failure_reason().body("teams")["attachments"][0]["content"]
    assert card["actions"] == [
        {"type": "Action.OpenUrl", "title": "The training job in the SageMaker console", "url": CONSOLE}
    ]
    assert "actions" not in cancel_cause().body("teams")["attachments"][0]["content"]


@pytest.mark.parametrize("make", NOTICES)
def test_json_carries_what_the_run_wrote_as_plain_strings_and_the_stacks_links_apart(make):
    notice = make()
    body = json.loads(json.dumps(notice.body("json")))
    assert isinstance(body["title"], str) and all(isinstance(line, str) for line in body["lines"])
    # no markup added, nothing escaped: the words as they were written, in JSON strings
    written = EVIL if make is not inline_spec_name else repr(EVIL)  # notify names an inline spec by its repr
    assert written in body["text"] and "&lt;" not in body["text"] and f"`{written}" not in body["text"]
    expected = (
        [{"label": "The training job in the SageMaker console", "url": CONSOLE}]
        if make is failure_reason
        else []
    )
    assert body["links"] == expected


@pytest.mark.parametrize(
    "url",
    [
        "javascript:alert(1)",
        "http://evil.example/",
        "https://evil.example/x|click",
        "https://evil.example/x>y",
        "https://evil.example/x)(y",
        "https://evil.example/a b",
    ],
)
def test_a_link_is_only_an_https_url_that_cannot_break_out_of_any_formats_link(url):
    with pytest.raises(ValueError, match="https://"):
        notices.Link("click", url)


def test_the_console_link_quotes_the_job_name_and_follows_the_partition():
    china = Settings(region="cn-north-1")
    assert notices.training_job_console(china, "a b|c").startswith("https://console.amazonaws.cn/sagemaker/")
    assert notices.training_job_console(china, "a b|c").endswith("#/jobs/a%20b%7Cc")
    gov = Settings(region="us-gov-west-1")
    assert notices.training_job_console(gov, "j").startswith("https://console.amazonaws-us-gov.com/")
