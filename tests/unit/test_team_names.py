"""A run's team, from where it was started (lustrain_core.teams): the stack's teams, a drop's folder, an API start's
`team`; a name no team may have is refused at the stack's setting, since it becomes a folder and a session tag."""

from __future__ import annotations

import pytest
from lustrain_core import teams
from lustrain_core.config import Settings
from lustrain_core.errors import SpecForbidden


def stack(named: str = "") -> Settings:
    return Settings(extra={"LUSTRAIN_TEAMS": named} if named else {})


def test_a_stack_naming_no_team_has_the_default_one():
    assert teams.teams_of(stack()) == ("default",)
    assert teams.teams_of(stack(" vision , speech ")) == ("vision", "speech")


@pytest.mark.parametrize("bad", ["Vision", "a/b", "-x", "x-", "a" * 33, "a*", "\u017f"])
def test_a_team_name_is_a_folder_and_a_session_tag_with_no_slash_or_wildcard(bad):
    with pytest.raises(ValueError, match="LUSTRAIN_TEAMS"):
        teams.teams_of(stack(f"ok,{bad}"))


def test_a_drop_belongs_to_its_folders_team_and_on_a_one_team_stack_anywhere():
    two = stack("vision,speech")
    assert teams.team_of_drop(two, "jobs/vision/run.yaml") == "vision"
    assert teams.team_of_drop(two, "jobs/speech/deep/run.yaml") == "speech"
    for outside in ("jobs/run.yaml", "jobs/robotics/run.yaml", "jobs/visionx/run.yaml"):
        with pytest.raises(SpecForbidden) as refused:
            teams.team_of_drop(two, outside)
        assert refused.value.details == {**refused.value.details, "field": "detail.object.key"}
    assert teams.team_of_drop(stack(), "jobs/anything/run.yaml") == "default"


def test_an_api_start_names_a_team_of_the_stack():
    two = stack("vision,speech")
    assert teams.team_of_input(two, "speech") == "speech"
    for claimed in (None, "robotics", "", 3, ["vision"]):
        with pytest.raises(SpecForbidden):
            teams.team_of_input(two, claimed)
    assert teams.team_of_input(stack(), None) == "default"
    assert teams.team_folder("s3://r/results", "vision") == teams.team_folder("s3://r/results/", "vision")
