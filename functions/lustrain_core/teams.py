"""Teams: who a run belongs to, and so what it may reach of other runs.

A stack is shared by everyone who may start a run, and each of them controls their job's code and, through it, the
job's role. The stack names its teams (the Teams parameter: LUSTRAIN_TEAMS, comma-separated; one team, `default`,
when unset, which keeps a single-team stack as it was). A run's team comes from where it was started:

- a spec dropped into the jobs bucket belongs to the team whose folder it lies in, `jobs/<team>/...`: who may write
  there is the jobs bucket's access, which the operator grants per team (docs/security.md). On a stack of one team a
  spec anywhere under jobs/ is that team's;
- a start through the Step Functions API or console names its team in the input (`"team": "<team>"`), checked
  against the stack's teams (a stack of one team may leave it out): StartExecution is granted to those trusted
  with every team.

The team is recorded with the run, tagged on everything it creates (lustrain:team) and carried by its training job's
session (the session tag lustrain-team), which is what the job's role is scoped by: its results folder
<allowed output prefix><team>/<job id>/ and the secrets tagged for its team. A team name is a folder of the jobs
bucket and of every results location: lower-case letters, digits and hyphens, never a "/".
"""

from __future__ import annotations

import re

from lustrain_core.config import Settings
from lustrain_core.errors import SpecForbidden

#: the stack setting naming the teams (template.yaml: Teams)
TEAMS = "LUSTRAIN_TEAMS"
#: the one team of a stack that names none
DEFAULT_TEAM = "default"
#: the tag every resource of a run carries, and the session tag of its training job
TAG_TEAM = "lustrain:team"
SESSION_TAG = "lustrain-team"
#: a team's name: a folder name in S3 and an IAM session tag's value, with no "/" (IAM's * matches across it)
TEAM_PATTERN = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?")
#: the folder of the jobs bucket specs are dropped under
JOBS_FOLDER = "jobs/"


def teams_of(settings: Settings) -> tuple[str, ...]:
    """The stack's teams, in the order it names them; ValueError for a name no team may have."""
    named = tuple(t.strip() for t in settings.extra.get(TEAMS, "").split(",") if t.strip())
    for team in named:
        if not TEAM_PATTERN.fullmatch(team):
            raise ValueError(
                f"stack setting {TEAMS}: {team!r} is not a team name (lower-case letters, digits and hyphens, "
                "1 to 32, starting and ending with a letter or digit)"
            )
    return named or (DEFAULT_TEAM,)


def _refused(field: str, value: object, teams: tuple[str, ...], how: str) -> SpecForbidden:
    return SpecForbidden(
        f"{field} {value!r}: {how}; this stack's teams: {', '.join(teams)}",
        rule=TEAMS,
        field=field,
    )


def team_of_drop(settings: Settings, key: str) -> str:
    """The team of a spec dropped at `key` of the jobs bucket: its folder jobs/<team>/ (any key of a one-team stack)."""
    teams = teams_of(settings)
    folder = key.removeprefix(JOBS_FOLDER).split("/", 1)
    if len(folder) == 2 and folder[0] in teams:
        return folder[0]
    if len(teams) == 1:
        return teams[0]
    raise _refused(
        "detail.object.key", key, teams, f"drop the spec under {JOBS_FOLDER}<team>/ for the team it runs for"
    )


def team_of_input(settings: Settings, team: object) -> str:
    """The team a start through the Step Functions API names (input `team`), one of the stack's."""
    teams = teams_of(settings)
    if team is None:
        if len(teams) == 1:
            return teams[0]
        raise _refused("team", None, teams, "a start through the API names the team it runs for")
    if not isinstance(team, str) or team not in teams:
        raise _refused("team", team, teams, "not a team of this stack")
    return team


def team_folder(prefix: str, team: str) -> str:
    """A team's folder of an allowed results location: <prefix><team>/."""
    return f"{prefix if prefix.endswith('/') else prefix + '/'}{team}/"
