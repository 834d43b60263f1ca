"""The README and docs/ hold to what they describe: the README stays a five-minute read, the deploy page names
every template parameter with its default (and none the template lacks), the README's figures about the stack are
the template's, and every link between the pages is relative and lands on a file and heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from lustrain.twin.cfn import load_template

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PARAMETERS = load_template(ROOT / "template.yaml")["Parameters"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readme_stays_a_short_read():
    size = len(README.read_bytes())
    assert size <= 12_500, f"README.md is {size} bytes: move detail into docs/"


def _parameter_rows() -> dict[str, str]:
    text = (ROOT / "docs" / "deploy.md").read_text()
    table = text.split("<!-- template-parameters -->\n")[1].split("<!-- /template-parameters -->")[0]
    rows = {}
    for row in table.strip().splitlines()[2:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        name = re.fullmatch(r"`(\w+)`", cells[0])
        assert name, f"a parameter's name in backticks: {row}"
        rows[name.group(1)] = "" if cells[1] == "empty" else cells[1].strip("`")
    return rows


def test_the_deploy_page_names_every_template_parameter_with_its_default():
    rows = _parameter_rows()
    assert set(rows) - set(PARAMETERS) == set(), "documented, but not a parameter of template.yaml"
    assert set(PARAMETERS) - set(rows) == set(), "a parameter of template.yaml the deploy page does not name"
    wrong = {
        name: (rows[name], str(p.get("Default")))
        for name, p in PARAMETERS.items()
        if rows[name] != str(p.get("Default"))
    }
    assert wrong == {}, "(documented, template's) defaults differ"


def test_the_parameter_count_and_the_instance_cap_the_pages_quote_are_the_templates():
    readme, deploy = README.read_text(), (ROOT / "docs" / "deploy.md").read_text()
    count = f"{len(PARAMETERS)} parameters"
    assert count in readme and count in deploy
    cap = int(re.search(r"default\s+`MaxInstancesPerRun` is (\d+)", readme).group(1))
    assert cap == PARAMETERS["MaxInstancesPerRun"]["Default"]
    # the README says the 50 x p4d example is refused under the default cap
    fleet = yaml.safe_load((ROOT / "examples" / "p4d-50x-persistent.yaml").read_text())["compute"][
        "instance_count"
    ]
    assert fleet > cap and "p4d-50x-persistent.yaml" in readme


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    headings = re.findall(r"^#{1,6} (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_every_link_between_the_pages_is_relative_and_lands():
    broken = []
    for page in [README, *DOCS]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web page, not one of ours
            where, _, anchor = target.partition("#")
            if where.startswith("/"):
                broken.append(f"{page.name}: {target} (absolute: write it relative to the page)")
                continue
            file = (page.parent / where).resolve() if where else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_the_readme_points_into_every_page_of_docs():
    linked = {Path(target.partition("#")[0]).name for target in LINK.findall(README.read_text())}
    assert {page.name for page in DOCS} - linked == set()


def test_each_generated_table_lives_in_one_page_with_its_closing_marker():
    pages = [README, *DOCS]
    markers = (
        "launch-plan-fields",
        "run-document-sections",
        "failure-classes",
        "template-parameters",
        "checkov-skips",
    )
    for marker in markers:
        holding = [page.name for page in pages if f"<!-- {marker} -->" in page.read_text()]
        assert len(holding) == 1, (marker, holding)
        assert f"<!-- /{marker} -->" in (ROOT / "docs" / holding[0]).read_text()


def test_the_security_pages_checkov_skips_are_the_templates_and_add_up_to_the_quoted_count():
    skipped: dict[str, int] = {}
    for resource in load_template(ROOT / "template.yaml")["Resources"].values():
        for skip in ((resource.get("Metadata") or {}).get("checkov") or {}).get("skip") or []:
            skipped[skip["id"]] = skipped.get(skip["id"], 0) + 1
    security = (ROOT / "docs" / "security.md").read_text()
    table = security.split("<!-- checkov-skips -->\n")[1].split("<!-- /checkov-skips -->")[0]
    listed: dict[str, int] = {}
    for row in table.strip().splitlines()[2:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        for check in re.findall(r"CKV_AWS_\d+", cells[0]):
            listed[check] = int(cells[2].split()[0])
    assert listed == skipped, "(a check, the resources that skip it): regenerate the table from template.yaml"
    # checkov counts a skip per check and resource: the figure the pages quote is this sum
    total = f"{sum(skipped.values())} skipped"
    assert total in security and total in (ROOT / "docs" / "figures.md").read_text()


def test_the_dependency_table_names_every_dependency_and_only_those():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    declared = {re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower() for requirement in required}
    makefile = (ROOT / "Makefile").read_text()
    installed_apart = {
        name
        for name in ("aws-sam-cli", "checkov", "mlflow")
        if re.search(rf"pip install --quiet --python \S+ {name}==", makefile)
    }
    text = (ROOT / "docs" / "development.md").read_text()
    table = text.split("## Dependencies, and why each")[1]
    rows = [row for row in table.splitlines() if row.startswith("| ") and not row.startswith("| package")]
    cells = [re.sub(r"\s*\([^)]*\)", "", row.split("|")[1]) for row in rows]  # "torch (2.13.0, CPU wheel)"
    named = {name.strip().lower() for cell in cells for name in cell.split(",")}
    assert installed_apart == {"aws-sam-cli", "checkov", "mlflow"}
    assert named == declared | installed_apart


def test_every_page_quotes_the_fault_matrix_at_its_size():
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench import fault_matrix  # the bench lives beside the tests, not in a package

    size = len(fault_matrix.cases())
    quoted = {
        "README.md": r"fault matrix's (\d+) runs",
        "docs/figures.md": r"(\d+) faults tried",
        "docs/reliability.md": r"\*\*total\*\* \| \*\*(\d+)\*\*",
    }
    for page, pattern in quoted.items():
        found = re.findall(pattern, (ROOT / page).read_text())
        assert found and {int(n) for n in found} == {size}, (page, found, size)
    rows = (ROOT / "docs" / "reliability.md").read_text().split("| faults | runs |")[1].split("**total**")[0]
    assert (
        sum(
            int(row.split("|")[2])
            for row in rows.splitlines()
            if row.count("|") > 3 and row.split("|")[2].strip().isdigit()
        )
        == size
    )
