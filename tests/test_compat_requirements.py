"""scripts/compat_requirements.py, which makes the version sets of `make test-compat`: the
lower set pins every dependency the package and its serve and interop extras claim at its
lower bound, the latest set keeps pyproject's ranges with torch pinned."""

from __future__ import annotations

import compat_requirements
import pytest


@pytest.fixture(scope="module")
def compat():  # the script as a module
    return compat_requirements


PYPROJECT = {
    "project": {
        "dependencies": ["torch>=2.2", "numpy>=1.24"],
        "optional-dependencies": {
            "serve": ["uvicorn>=0.29"],
            "interop": ["transformers>=4.40,<6", "mkdocstrings[python]>=0.24"],
            "dev": ["pytest>=8", "ruff==0.17.6", "types-PyYAML", "playwright>=1.40", "httpx>=0.27",
                    "aiayn[serve,interop]"],
        },
    }
}


def test_lower_set_pins_each_floor_with_its_extras(compat) -> None:
    assert compat.requirements("lower", PYPROJECT, None, []) == [
        "torch==2.2", "numpy==1.24", "uvicorn==0.29", "transformers==4.40", "mkdocstrings[python]==0.24"]


def test_latest_set_keeps_the_ranges_and_pins_torch(compat) -> None:
    assert compat.requirements("latest", PYPROJECT, "2.6.0", []) == [
        "torch==2.6.0", "numpy>=1.24", "uvicorn>=0.29", "transformers>=4.40,<6", "mkdocstrings[python]>=0.24"]


def test_a_pin_replaces_that_package_whatever_its_spelling(compat) -> None:
    lower = compat.requirements("lower", PYPROJECT, None, ["Uvicorn==0.30.0", "numpy==1.26.4"])
    assert lower == ["torch==2.2", "numpy==1.26.4", "Uvicorn==0.30.0", "transformers==4.40",
                     "mkdocstrings[python]==0.24"]


def test_tools_are_the_dev_extra_without_linters_stubs_browser_and_self(compat) -> None:
    assert compat.requirements("tools", PYPROJECT, None, []) == ["pytest>=8", "httpx>=0.27"]
    assert compat.requirements("tools", PYPROJECT, None, [], floors=True) == ["pytest==8", "httpx==0.27"]


def test_a_requirement_without_a_floor_is_refused(compat) -> None:
    with pytest.raises(SystemExit, match="claims no lower bound"):
        compat.lowest("fastapi")


def test_the_real_pyproject_has_a_floor_for_every_dependency(compat) -> None:
    lower = compat.main(["lower"])
    assert lower == 0
