"""The run's notices in the team's chat: a webhook (Slack, Microsoft Teams, or any endpoint taking JSON).

Where they go: the stack's NoticeWebhookSecretArn names a Secrets Manager secret; the notify function, its only
reader (GetSecretValue on that ARN alone), finds the ARN in LUSTRAIN_NOTICE_WEBHOOK_SECRET. The URL is a
credential (whoever holds it posts to the channel), so it lives only in the secret: never in the function's
settings, a log line, an output or an error. The secret's value is either

- the URL alone: the format follows its host (hooks.slack.com: slack; *.webhook.office.com, *.logic.azure.com,
  *.powerautomate.com, *.powerplatform.com, flow.microsoft.com: teams; any other: json), or
- JSON `{"url": "https://...", "format": "slack" | "teams" | "json"}` to say which.

It is read once per warm container and kept (a rotated secret is read again when a post is refused with 401,
403 or 404, once).

What is posted (one notice per moment of the run): started (the execution began), queued (it waits in the
capacity queue) and admitted (after a wait), attempt-ended (each training job's end and why), cancelled (by whom
where the stop's cause says: `lustrain cancel` names its caller; a console stop is known only to CloudTrail),
timed-out, and the end: succeeded, failed or refused. Each says the cost so far (steps/budget.py's
cost_so_far_usd, as `lustrain status` counts it), where the model is or will be, and the `lustrain` command that
shows more.

Formats: slack posts `{"text", "blocks"}` (Block Kit: a section in mrkdwn and a context line), teams a message
with one Adaptive Card attachment (what Teams' incoming webhooks and Workflows' "Send webhook alerts to a channel"
take), json `{"source": "lustrain", "kind", "job_id", "title", "lines", "text", "cost_so_far_usd",
"model_s3_uri", "command", "facts", "links"}`.

What a run's author, its code or its caller wrote (a training job's FailureReason, a spec's name or source, a
stop's cause, an error, an execution's name, metrics' names: Quoted) is shown as text, never as markup, so that
no link, mention or formatting of theirs posts under the bot's name: slack escapes &, < and > (Slack's control
characters) in the top-level text (what notifications show) and in every mrkdwn field, and puts quoted words in
a code span (their backticks shown as U+02CB, so that they cannot end it); teams has no Markdown field at all
(TextBlock and Fact read Markdown): every line is a RichTextBlock of TextRuns, which Adaptive Cards never read as
Markdown, the quoted words in monospace; json sends plain JSON strings. Only the stack's own links (Link: the
SageMaker console's page of an attempt's training job) are links: slack `<url|label>`, teams an Action.OpenUrl,
json `links`.

Delivery never blocks nor fails a run: at most TRIES posts, each with a TIMEOUT_S timeout, a short pause between
them; a 4xx answer other than 408 and 429 is not tried again. `post` raises nothing: it answers a Delivery (the
kind, the tries, the last answer's status or the error's class: no URL), which the handler logs as "notice not
delivered" (a log line a metric filter can count) when it failed.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.config import Settings
from lustrain_core.steps.records import JobRecord

#: the function's setting that names the secret (the ARN; the URL is in the secret)
SECRET_SETTING = "LUSTRAIN_NOTICE_WEBHOOK_SECRET"  # noqa: S105 (the name of a setting holding an ARN)
FORMATS = ("slack", "teams", "json")
#: posts of one notice at most, each given this long to answer
TRIES = 3
TIMEOUT_S = 5.0
#: seconds before the second and the third post
PAUSES_S = (0.5, 2.0)
#: what a webhook may answer and still be tried again (408 timeout, 429 slow down; 5xx below)
RETRIED_4XX = frozenset({408, 429})
#: answers after which the secret is read again once (a rotated URL)
STALE_URL = frozenset({401, 403, 404, 410})
KINDS = (
    "started",
    "queued",
    "admitted",
    "attempt-ended",
    "cancelled",
    "timed-out",
    "succeeded",
    "failed",
    "refused",
)
_TEAMS_HOSTS = (".webhook.office.com", ".logic.azure.com", ".powerautomate.com", ".powerplatform.com")


class WebhookInvalid(ValueError):
    """The secret's value is not a webhook lustrain can post to; the message names the field, never the URL."""


@dataclass(frozen=True)
class Webhook:
    url: str = field(repr=False)
    format: str

    def __repr__(self) -> str:  # the URL is a credential: never in a log line or a traceback's locals
        return f"Webhook(format={self.format!r})"


def parse_webhook(secret_string: str) -> Webhook:
    """The secret's value (the URL, or {"url", "format"}) as a webhook; WebhookInvalid names what is wrong."""
    text = secret_string.strip()
    given_format: Any = None
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise WebhookInvalid("the secret is neither a URL nor JSON {url, format}") from None
        if not isinstance(value, dict):
            raise WebhookInvalid("the secret's JSON must be an object {url, format}")
        url, given_format = value.get("url"), value.get("format")
        if not isinstance(url, str) or not url:
            raise WebhookInvalid("the secret's url: missing; it must be the webhook's https:// URL")
        text = url.strip()
    parts = urllib.parse.urlsplit(text)
    local = parts.hostname in ("127.0.0.1", "localhost")
    if parts.scheme not in ("https", "http") or not parts.hostname or (parts.scheme == "http" and not local):
        raise WebhookInvalid(
            "the secret's url: must be an https:// URL (http:// only to 127.0.0.1, for tests)"
        )
    if given_format is None:
        given_format = format_of(parts.hostname)
    if given_format not in FORMATS:
        raise WebhookInvalid(f"the secret's format: {given_format!r} is not one of {', '.join(FORMATS)}")
    return Webhook(url=text, format=given_format)


def format_of(host: str) -> str:
    """The format a webhook's host takes."""
    host = host.lower()
    if host == "hooks.slack.com":
        return "slack"
    if host.endswith(_TEAMS_HOSTS) or host == "flow.microsoft.com":
        return "teams"
    return "json"


_cache: dict[str, Webhook] = {}


def webhook(secrets: Any, secret_arn: str, *, fresh: bool = False) -> Webhook:
    """The webhook the secret holds, read once per warm container (again with `fresh`)."""
    if fresh or secret_arn not in _cache:
        value = secrets.get_secret_value(SecretId=secret_arn)
        if "SecretString" not in value:
            raise WebhookInvalid(
                "the secret holds binary data; store the URL (or {url, format}) as its string"
            )
        _cache[secret_arn] = parse_webhook(value["SecretString"])
    return _cache[secret_arn]


def forget() -> None:
    """Forget the webhooks read (tests; a new container starts without them)."""
    _cache.clear()


@dataclass(frozen=True)
class Quoted:
    """Words a notice quotes rather than says: what a run's author, its code or its caller wrote (a training job's
    FailureReason, a stop's cause, an error, a spec's name or source, an execution's name, a run's id, the command
    that names it). The chat formats show them as quoted text, never as markup: a link, a mention or formatting in
    them stays text (Slack: an escaped code span; Teams: a monospace TextRun, which Adaptive Cards never read as
    Markdown)."""

    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Link:
    """A link the stack builds itself (a console page): the only link a notice shows as one."""

    label: str
    url: str

    def __post_init__(self) -> None:
        if not self.url.startswith("https://") or any(c in self.url for c in _NOT_IN_LINKS):
            raise ValueError("a notice's link must be an https:// URL without spaces, quotes, brackets or |")


#: what a link the stack builds never holds (each would end or break the link's markup in one of the formats)
_NOT_IN_LINKS = frozenset(" \t\r\n<>|()[]\"'`")

#: a part of a notice's line: the stack's own words (a str) or words it quotes
Part = str | Quoted
Line = tuple[Part, ...]
#: the longest quoted text a chat shows (a FailureReason is at most 1,024 characters): the rest is cut, with "…"
MAX_QUOTED = 1200


def quoted(value: Any) -> Part:
    """A value a notice quotes; a number stays the stack's own words (nothing in it can be markup)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return Quoted(str(value))


def plain(line: Line) -> str:
    """A line as plain text (the json format's title, lines and text)."""
    return "".join(str(part) for part in line)


def _clipped(text: str) -> str:
    return text if len(text) <= MAX_QUOTED else text[: MAX_QUOTED - 1] + "…"


def _slack_escaped(text: str) -> str:
    """Slack's escaping (api.slack.com/reference/surfaces/formatting#escaping): &, < and > are its control
    characters, in `text` as in mrkdwn; escaped, `<https://x|click>` and `<!channel>` show as text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_code(text: str) -> str:
    """Quoted words as a code span, escaped all the same: no formatting, mention nor link is read in it. Their
    backticks (which would end the span) are shown as U+02CB, a modifier grave accent; their lines are joined (a
    span does not cross a line)."""
    flat = " ".join(_clipped(text).replace("`", "\u02cb").split())
    return f"`{_slack_escaped(flat)}`" if flat else '""'


def _slack_line(line: Line) -> str:
    return "".join(_slack_code(p.text) if isinstance(p, Quoted) else _slack_escaped(p) for p in line)


def _teams_quoted(text: str) -> str:
    """Quoted words for a TextRun, which Adaptive Cards never read as Markdown (nor HTML); a zero-width space
    also breaks `](` and `<`, so that a client that would (old Android renderers ran TextRuns through Markdown)
    shows no link, no tag: the words read the same."""
    return _clipped(text).replace("](", "]\u200b(").replace("<", "<\u200b")


def _teams_block(line: Line, **style: str) -> dict[str, Any]:
    """A line as a RichTextBlock: TextRuns only (no Markdown), the quoted words in monospace."""
    runs = [
        {"type": "TextRun", "text": _teams_quoted(p.text), "fontType": "Monospace", **style}
        if isinstance(p, Quoted)
        else {"type": "TextRun", "text": p, **style}
        for p in line
        if str(p)
    ]
    return {"type": "RichTextBlock", "inlines": runs}


def _teams_fact(label: str, value: Part) -> dict[str, Any]:
    """A footer's fact (FactSet's values read Markdown): its label in bold, then its value."""
    block = _teams_block((value,))
    block["inlines"].insert(0, {"type": "TextRun", "text": f"{label}: ", "weight": "Bolder"})
    return block


@dataclass(frozen=True)
class Notice:
    """One moment of a run, told in a few lines: the stack's own words and the words it quotes (Quoted), which
    each format shows as text, never as markup; `links` are the stack's own (console pages), shown as links."""

    kind: str
    job_id: str
    title: Line
    lines: list[Line]
    cost_so_far_usd: float | None
    model_s3_uri: str | None
    command: str
    facts: dict[str, Any] = field(default_factory=dict)
    links: tuple[Link, ...] = ()

    def text(self) -> str:
        """The notice in plain text (the json format's `text`)."""
        return "\n".join(
            [
                plain(self.title),
                *(plain(line) for line in self.lines),
                *(f"{link.label}: {link.url}" for link in self.links),
                *(f"{label}: {value}" for label, value in self._footer()),
            ]
        )

    def _footer(self) -> list[tuple[str, Part]]:
        cost = f"${self.cost_so_far_usd:,.2f}" if self.cost_so_far_usd is not None else "unknown"
        model: Part = Quoted(self.model_s3_uri) if self.model_s3_uri else "none yet"
        return [("Cost so far", cost), ("Model", model), ("More", Quoted(self.command))]

    def body(self, fmt: str) -> dict[str, Any]:
        """What is posted to a webhook of format `fmt`."""
        if fmt == "slack":
            return self._slack()
        if fmt == "teams":
            return self._teams()
        # JSON strings all: nothing is interpolated into markup (whoever reads it renders it as it sees fit)
        return {
            "source": "lustrain",
            "kind": self.kind,
            "job_id": self.job_id,
            "title": plain(self.title),
            "lines": [plain(line) for line in self.lines],
            "cost_so_far_usd": self.cost_so_far_usd,
            "model_s3_uri": self.model_s3_uri,
            "command": self.command,
            "facts": self.facts,
            "links": [asdict(link) for link in self.links],
            "text": self.text(),
        }

    def _slack(self) -> dict[str, Any]:
        # every text (the top-level `text`, which notifications show, and each mrkdwn field) is escaped; quoted
        # words are code spans; only the stack's own links are <url|label>
        body = "\n".join(
            [
                f"*{_slack_line(self.title)}*",
                *(_slack_line(line) for line in self.lines),
                *(f"<{link.url}|{_slack_escaped(link.label)}>" for link in self.links),
            ]
        )
        (cost, model, more) = self._footer()
        footer = " | ".join(
            [_slack_line((f"{cost[0]}: ", cost[1])), _slack_line((f"{model[0]}: ", model[1]))]
        )
        footer += f" | {_slack_line((more[1],))}"
        return {
            "text": f"{body}\n{footer}",
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": body[:3000]}},
                {"type": "context", "elements": [{"type": "mrkdwn", "text": footer[:3000]}]},
            ],
        }

    def _teams(self) -> dict[str, Any]:
        # no Markdown field at all (TextBlock and Fact read Markdown: a quoted `[click](https://x)` would be a
        # link): every line is a RichTextBlock of TextRuns; only the stack's own links are actions
        card: dict[str, Any] = {
            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
            "type": "AdaptiveCard",
            "version": "1.4",
            "body": [
                _teams_block(self.title, weight="Bolder", size="Medium"),
                *(_teams_block(line) for line in self.lines),
                *(_teams_fact(label, value) for label, value in self._footer()),
            ],
        }
        if self.links:
            card["actions"] = [
                {"type": "Action.OpenUrl", "title": link.label, "url": link.url} for link in self.links
            ]
        return {
            "type": "message",
            "attachments": [
                {
                    "contentType": "application/vnd.microsoft.card.adaptive",
                    "contentUrl": None,
                    "content": card,
                }
            ],
        }


@dataclass(frozen=True)
class Delivery:
    """How a notice fared: delivered or not, after how many posts, and the last answer (no URL)."""

    kind: str
    delivered: bool
    tries: int
    status: int | None = None
    error: str | None = None
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _post_once(url: str, body: bytes, timeout: float) -> int:
    # parse_webhook let through https://, and http:// to 127.0.0.1 only
    request = urllib.request.Request(  # noqa: S310
        url, data=body, method="POST", headers={"Content-Type": "application/json", "User-Agent": "lustrain"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)


def configured(settings: Settings) -> bool:
    """Whether the stack names a webhook's secret."""
    return bool(settings.extra.get(SECRET_SETTING, "").strip())


def post(
    notice: Notice,
    *,
    secrets: Any,
    settings: Settings,
    sleep: Callable[[float], None] = time.sleep,
    timeout: float = TIMEOUT_S,
) -> Delivery:
    """Post the notice to the stack's webhook; never raises. Skipped (delivered False) when none is set."""
    secret_arn = settings.extra.get(SECRET_SETTING, "").strip()
    if not secret_arn:
        return Delivery(notice.kind, delivered=False, tries=0, skipped=f"no {SECRET_SETTING}")
    status: int | None = None
    error: str | None = None
    tries = 0
    reread = False
    try:
        hook = webhook(secrets, secret_arn)
        while tries < TRIES:
            if tries:
                sleep(PAUSES_S[min(tries - 1, len(PAUSES_S) - 1)])
            tries += 1
            status, error = None, None
            try:
                status = _post_once(
                    hook.url, json.dumps(notice.body(hook.format), default=str).encode(), timeout
                )
            except (OSError, ValueError) as exc:  # refused, unreachable, timed out (URLError is an OSError)
                error = type(exc).__name__
                continue
            if 200 <= status < 300:
                return Delivery(notice.kind, delivered=True, tries=tries, status=status)
            if status in STALE_URL and not reread:
                reread = True
                hook = webhook(secrets, secret_arn, fresh=True)
                continue
            if 400 <= status < 500 and status not in RETRIED_4XX:
                break
    except WebhookInvalid as exc:
        error = f"WebhookInvalid: {exc}"
    except ClientError as exc:
        error = f"GetSecretValue: {exc.response.get('Error', {}).get('Code', 'error')}"
    except Exception as exc:  # a notice never fails the run; the class says what went wrong
        error = type(exc).__name__
    return Delivery(notice.kind, delivered=False, tries=tries, status=status, error=error)


# ------------------------------------------------------------------ what each notice says
# Whatever a notice tells that the stack did not write itself is Quoted: a run's id and its spec's name (its
# author's), an execution's name and input (its caller's), a stop's cause, an error and its cause, a training
# job's FailureReason (its code's), metrics, resources' names, a pool, a model's URI.


def command(settings: Settings, run: str) -> str:
    """The command that shows the run (`lustrain status` takes a job id or an execution name)."""
    return f"lustrain status {run} --stack {settings.stack_name}"


def training_job_console(settings: Settings, training_job: str) -> str:
    """The SageMaker console's page of a training job (the stack's own link: its region, the job's name)."""
    region = urllib.parse.quote(settings.region, safe="")
    if settings.region.startswith("cn-"):
        host = "console.amazonaws.cn"
    elif settings.region.startswith("us-gov-"):
        host = "console.amazonaws-us-gov.com"
    else:
        host = f"{region}.console.aws.amazon.com"
    return f"https://{host}/sagemaker/home?region={region}#/jobs/{urllib.parse.quote(training_job, safe='')}"


def figure(value: Any) -> str:
    """A metric as the trainer logs it: a whole number (a step, tokens seen) without ".0", others to 6 digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def started(execution: str, spec_source: str | None, settings: Settings) -> Notice:
    """The execution began: register_job has not recorded the run yet, so it is named by its spec's file (the
    key's last part, where a dropped file started it) and its execution."""
    lines: list[Line] = [("Spec: ", Quoted(spec_source))] if spec_source else []
    lines.append(("Nothing is billed before the run's instances are admitted out of the capacity queue.",))
    spec_file = spec_source.rsplit("/", 1)[-1] if spec_source else ""
    title: Line = (
        ("lustrain run started: ", Quoted(spec_file), ", execution ", Quoted(execution))
        if spec_file
        else ("lustrain run started: execution ", Quoted(execution))
    )
    return Notice(
        kind="started",
        job_id=execution,
        title=title,
        lines=lines,
        cost_so_far_usd=0.0,
        model_s3_uri=None,
        command=command(settings, execution),
        facts={"execution": execution, "spec_source": spec_source},
    )


def stopped(
    kind: str,
    record: JobRecord,
    cause: str | None,
    cost: float | None,
    model: str | None,
    settings: Settings,
) -> Notice:
    """The execution was stopped (cancelled) or ran out of time (timed-out): its teardown follows."""
    job_id = record.job_id
    lines: list[Line]
    if kind == "cancelled":
        lines = [
            ("Cancelled: ", Quoted(cause))
            if cause
            else (
                "Cancelled: no cause given (a console or CLI stop: CloudTrail's StopExecution record names"
                " the caller)",
            )
        ]
    else:
        lines = [("The execution ran past its time limit: ", Quoted(cause) if cause else "TIMED_OUT")]
    lines.append(
        ("Its teardown stops the training job (which saves a checkpoint) and deletes what the run created.",)
    )
    return Notice(
        kind=kind,
        job_id=job_id,
        title=("lustrain run ", Quoted(job_id), " cancelled" if kind == "cancelled" else " timed out"),
        lines=lines,
        cost_so_far_usd=cost,
        model_s3_uri=model,
        command=command(settings, job_id),
        facts={"cause": cause, "spec_name": record.name},
    )


def attempt_ended(
    record: JobRecord,
    *,
    training_job: str,
    attempt: int,
    status: str,
    why: str,
    cost: float | None,
    model: str | None,
    settings: Settings,
) -> Notice:
    """One training job (an attempt) ended: Completed, Failed or Stopped, and why."""
    job_id = record.job_id
    return Notice(
        kind="attempt-ended",
        job_id=job_id,
        title=("lustrain run ", Quoted(job_id), f": attempt {attempt} {status.lower()}"),
        lines=[("Training job: ", Quoted(training_job)), ("Why: ", Quoted(why))],
        cost_so_far_usd=cost,
        model_s3_uri=model,
        command=command(settings, job_id),
        facts={"attempt": attempt, "status": status, "why": why, "training_job_name": training_job},
        links=(
            Link("The training job in the SageMaker console", training_job_console(settings, training_job)),
        ),
    )


def queue_moment(
    record: JobRecord,
    *,
    admitted: bool,
    detail: dict[str, Any],
    cost: float | None,
    model: str | None,
    settings: Settings,
) -> Notice:
    """The run waits in its pool's capacity queue, or was admitted after waiting."""
    job_id = record.job_id
    pool = quoted(detail.get("pool"))
    waited = quoted(detail.get("queued_s"))
    title: Line
    if admitted:
        title = ("lustrain run ", Quoted(job_id), " admitted out of the capacity queue")
        lines: list[Line] = [
            (
                "Pool: ",
                pool,
                ", after ",
                waited,
                " s in the queue; its network and file system are created now.",
            )
        ]
    else:
        title = ("lustrain run ", Quoted(job_id), " waits in the capacity queue")
        lines = [
            (
                "Pool: ",
                pool,
                ", place ",
                quoted(detail.get("position")),
                " in line; the instances it needs do not fit the quota left now (it may wait"
                " compute.max_queue_hours). Nothing of the run is billed while it waits.",
            )
        ]
    return Notice(
        kind="admitted" if admitted else "queued",
        job_id=job_id,
        title=title,
        lines=lines,
        cost_so_far_usd=cost,
        model_s3_uri=model,
        command=command(settings, job_id),
        facts={k: detail.get(k) for k in ("pool", "position", "queued_s")},
    )


def ended(facts: dict[str, Any], cost: float | None, settings: Settings) -> Notice:
    """The run's end (notify's facts: steps/notify.py `summary`)."""
    job_id, outcome = str(facts["job_id"]), str(facts["outcome"])
    lines: list[Line] = []
    if facts.get("error"):
        lines.append(("Error: ", Quoted(f"{facts['error']}: {facts.get('cause')}")))
    if facts.get("metrics"):
        shown = ", ".join(f"{k}={figure(v)}" for k, v in sorted(facts["metrics"].items()))
        lines.append(("Final metrics: ", Quoted(shown)))
    if facts.get("remaining"):
        lines.append(
            ("Still there (delete by hand): ", Quoted(", ".join(str(r) for r in facts["remaining"])))
        )
    if facts.get("teardown_error"):
        lines.append(("Teardown did not finish: ", Quoted(str(facts["teardown_error"]))))
    if facts.get("budget_usd") is not None:
        lines.append((f"Budget: ${facts['budget_usd']:,.2f}",))
    registered = job_id if facts.get("spec_name") and not job_id.startswith("the spec ") else None
    execution = facts.get("execution")
    return Notice(
        kind=outcome if outcome in KINDS else "failed",
        job_id=job_id,
        title=("lustrain run ", Quoted(job_id), " ", outcome if outcome in KINDS else Quoted(outcome)),
        lines=lines,
        cost_so_far_usd=cost,
        model_s3_uri=facts.get("archive_s3_uri"),
        command=command(settings, registered or str(execution or job_id)),
        facts={
            k: facts.get(k) for k in ("outcome", "error", "training_job_name", "execution", "spec_source")
        },
    )
