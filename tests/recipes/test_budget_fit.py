"""The recipe variant for a machine: the variants file's rules, the choice from a mocked
update rate (exact thresholds and reason), the probe's arithmetic on a real tiny run, and
`aiayn choose-recipe` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

import aiayn
from aiayn.config import Config, apply_overrides, load_config
from aiayn.errors import ConfigError
from aiayn.recipes.budget_fit import (
    RecipeChoice,
    RecipeVariant,
    UpdateRate,
    check_variants,
    choose_variant,
    load_variants,
    measure_update_rate,
    previous_choice,
)
from aiayn.runtime.cpu import cpu_kind
from aiayn.training.trainer import StepResult, Trainer

from .conftest import ROOT

HEAVY = RecipeVariant("as written", 3000, ())
MIDDLE = RecipeVariant("middle", 2000, ("model.d_ff=512",))
LIGHT = RecipeVariant("light", 0, ("model.d_ff=512", "model.n_decoder_layers=2"))
VARIANTS = [HEAVY, MIDDLE, LIGHT]


def _timed(minutes: float = 45.0, steps: int = 0) -> Config:
    return apply_overrides(Config(), [f"train.max_time_minutes={minutes}", f"train.max_steps={steps}",
                                      "train.lr_schedule=inverse_sqrt"])


def _rate(updates_per_s: float) -> Callable[[Config], UpdateRate]:
    return lambda cfg: UpdateRate(updates_per_s, 1800.0)


# ------------------------------------------------------------------ the variants file


def test_the_shipped_variants_apply_to_both_multi30k_configs() -> None:
    variants = load_variants(ROOT / "configs" / "variants" / "multi30k.yaml")
    assert [v.min_updates for v in variants] == sorted((v.min_updates for v in variants), reverse=True)
    assert variants[0].overrides == () and variants[-1].min_updates == 0
    for name in ("multi30k_en_de.yaml", "multi30k_de_en.yaml"):
        cfg = load_config(ROOT / "configs" / name)
        check_variants(cfg, variants, "variants")  # raises on any override the config refuses
        light = apply_overrides(cfg, list(variants[-1].overrides))
        assert (light.model.d_ff, light.model.n_decoder_layers) == (512, 2)


@pytest.mark.parametrize(("text", "message"), [
    ("[1, 2]", "expected a mapping with a non-empty 'variants' list"),
    ("variants: []", "expected a mapping with a non-empty 'variants' list"),
    ("variants: [{name: a, min_updates: 0}]", "variants[0]: expected exactly the keys name, min_updates, overrides"),
    ("variants: [{name: '', min_updates: 0, overrides: []}]", "variants[0].name: expected a non-empty string"),
    ("variants: [{name: a, min_updates: -1, overrides: []}]",
     "variants[0].min_updates: expected a whole number >= 0, got -1"),
    ("variants: [{name: a, min_updates: true, overrides: []}]",
     "variants[0].min_updates: expected a whole number >= 0, got True"),
    ("variants: [{name: a, min_updates: 0, overrides: model.d_ff=3}]",
     "variants[0].overrides: expected a list of section.key=value strings"),
    ("variants: [{name: a, min_updates: 5, overrides: []}]",
     "variants[0].min_updates: the last variant must be 0 (the one every machine can run)"),
    ("variants: [\n  - {name: a", "cannot read the variants: "),
])
def test_a_bad_variants_file_is_one_line_naming_the_entry(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_variants(path)
    assert str(info.value).startswith(f"{path}: {message}") and "\n" not in str(info.value)


def test_a_missing_variants_file() -> None:
    with pytest.raises(ConfigError, match=r"^/no/such\.yaml: variants file not found$"):
        load_variants("/no/such.yaml")


def test_an_override_the_config_refuses_names_its_variant() -> None:
    bad = [HEAVY, RecipeVariant("broken", 0, ("model.d_fff=3",))]
    refused = r"^v\.yaml: variants\[1\] \(broken\): model\.d_fff: unknown field \(did you mean 'd_ff'\?\)$"
    with pytest.raises(ConfigError, match=refused):
        check_variants(_timed(), bad, "v.yaml")
    check_variants(_timed(), VARIANTS, "v.yaml")


def test_the_callers_overrides_are_checked_after_each_variants() -> None:
    """A short run's own schedule wins over a variant's, as in training: the light variant's
    warmup of 200 would refuse a 12-update cosine run, the caller's warmup of 4 does not."""
    short = ["train.max_time_minutes=0", "train.max_steps=12", "train.warmup_steps=4", "train.lr_schedule=cosine"]
    cfg = apply_overrides(Config(), short)
    light = [RecipeVariant("light", 0, ("train.warmup_steps=200",))]
    with pytest.raises(ConfigError, match=r"^v\.yaml: variants\[0\] \(light\): train\.lr_schedule: cosine"):
        check_variants(cfg, light, "v.yaml")
    check_variants(cfg, light, "v.yaml", short)


# ------------------------------------------------------------------ the choice


@pytest.mark.parametrize(("updates_per_s", "chosen", "projected"), [
    (3000 / 2700, "as written", 3000),        # exactly the heavy variant's need
    (2999.9 / 2700, "middle", 2999),          # one update short of it
    (2000 / 2700, "middle", 2000),
    (1999.9 / 2700, "light", 1999),
    (0.01, "light", 27),
])
def test_the_first_variant_whose_need_the_projection_meets(updates_per_s: float, chosen: str,
                                                          projected: int) -> None:
    choice = choose_variant(VARIANTS, _timed(45), _rate(updates_per_s), machine="AVX2")
    assert (choice.variant.name, choice.projected_updates, choice.budget_minutes) == (chosen, projected, 45.0)
    assert choice.rate == UpdateRate(updates_per_s, 1800.0) and choice.machine == "AVX2"


def test_the_reason_names_the_measurement_and_the_variant_it_fell_short_of() -> None:
    choice = choose_variant(VARIANTS, _timed(45), _rate(0.6), machine="AVX2")
    assert choice.reason == ("0.600 updates/s (1,800 target tokens each) measured: ~1,620 updates in 45 min; "
                             "light runs on any machine; middle needs >= 2,000")
    heavy = choose_variant(VARIANTS, _timed(10), _rate(6.0))
    assert heavy.reason == ("6.000 updates/s (1,800 target tokens each) measured: ~3,600 updates in 10 min; "
                            "as written needs >= 3,000")


def test_the_budget_is_the_configs_time() -> None:
    assert choose_variant(VARIANTS, _timed(60), _rate(0.6)).variant is MIDDLE  # 2,160 updates
    assert choose_variant(VARIANTS, _timed(90), _rate(0.6)).variant is HEAVY  # 3,240


def test_a_run_bounded_by_steps_takes_the_first_variant_unmeasured() -> None:
    def never(cfg: Config) -> UpdateRate:
        raise AssertionError("measured")

    for cfg in (_timed(45, steps=1000), _timed(0, steps=1000)):
        choice = choose_variant(VARIANTS, cfg, never)
        assert (choice.variant, choice.rate, choice.projected_updates) == (HEAVY, None, None)
        assert choice.reason == "train.max_steps bounds the run (not time): the recipe's first variant"


def test_a_previous_choice_round_trips_and_is_kept(tmp_path: Path) -> None:
    made = choose_variant(VARIANTS, _timed(45), _rate(0.6), machine="AVX2")
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(made.to_dict()), encoding="utf-8")
    assert json.loads(path.read_text())["variant"] == {"name": "light", "min_updates": 0,
                                                       "overrides": list(LIGHT.overrides)}
    kept = previous_choice(path, VARIANTS, _timed(45))
    assert kept == RecipeChoice(LIGHT, f"chosen before ({path}): kept, as the run continues", 45.0)


@pytest.mark.parametrize(("content", "message"), [
    ('{"variant": {"name": "gone"}}', "variant 'gone' is not in the variants file (as written, middle, light)"),
    ('{"variant": 3}', "not a recipe choice"),
    ("not json", "not a recipe choice"),
])
def test_a_bad_previous_choice_is_one_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "recipe.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        previous_choice(path, VARIANTS, _timed(45))
    assert str(info.value).startswith(f"{path}: {message}")


# ------------------------------------------------------------------ the probe


SYNTHETIC = {"synthetic": "reverse", "synthetic_train_size": 200, "synthetic_valid_size": 6,
             "synthetic_min_len": 2, "synthetic_max_len": 5, "synthetic_vocab": 8, "spm_model_type": "word"}
TINY = ["model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "train.max_tokens=64", "train.lr_schedule=inverse_sqrt", "train.dtype=fp32"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fit") / "prepared"
    aiayn.prepare(out, progress=False, **SYNTHETIC)
    return out


def test_the_probe_counts_timed_updates_and_their_tokens(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = apply_overrides(Config(), [*TINY, f"data.prepared_dir={prepared}"])
    steps: list[int] = []
    real_step = Trainer.train_step

    def counted(self: Trainer, batches: list) -> StepResult:  # the tokens of each update, as counted
        result = real_step(self, batches)
        steps.append(result.n_tokens)
        return result

    monkeypatch.setattr(Trainer, "train_step", counted)
    ticks = iter([10.0, 14.0])  # the clock read before and after the timed updates: 4 s
    rate = measure_update_rate(cfg, updates=3, warmup=2, clock=lambda: next(ticks))
    assert len(steps) == 5
    assert rate == UpdateRate(3 / 4.0, sum(steps[2:]) / 3)
    assert all(0 < n <= 64 for n in steps)


def test_the_probe_needs_prepared_data() -> None:
    with pytest.raises(ConfigError, match=r"^data\.prepared_dir: the probe trains on prepared data"):
        measure_update_rate(Config())


# ------------------------------------------------------------------ the command


def _choose(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aiayn", "choose-recipe", *args], cwd=ROOT,
                          capture_output=True, text=True)


def test_the_command_prints_the_overrides_and_writes_the_choice(tmp_path: Path, prepared: Path) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(apply_overrides(Config(), TINY).to_dict()), encoding="utf-8")
    variants = tmp_path / "variants.yaml"
    # A need no machine meets, then the fallback: the probe runs and the light one is chosen.
    variants.write_text(yaml.safe_dump({"variants": [
        {"name": "heavy", "min_updates": 10**12, "overrides": []},
        {"name": "light", "min_updates": 0, "overrides": ["model.d_ff=32", "train.warmup_steps=10"]}]}))
    out = tmp_path / "choice.json"
    proc = _choose("--config", str(config), "--variants", str(variants), "--threads", "1", "--json", str(out),
                   f"data.prepared_dir={prepared}", "train.max_time_minutes=1", "train.max_steps=0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["model.d_ff=32", "train.warmup_steps=10"]
    choice = json.loads(out.read_text())
    assert choice["variant"]["name"] == "light" and choice["budget_minutes"] == 1.0
    assert choice["projected_updates"] == int(choice["rate"]["updates_per_s"] * 60)
    said = proc.stderr.splitlines()[-1]
    assert said.startswith("recipe: light (") and said.endswith("; heavy needs >= 1,000,000,000,000; AMX)".replace(
        "AMX", cpu_kind()))
    # Again with the earlier choice: kept, unmeasured.
    again = _choose("--config", str(config), "--variants", str(variants), "--previous", str(out),
                    f"data.prepared_dir={prepared}", "train.max_time_minutes=1", "train.max_steps=0")
    assert again.returncode == 0 and again.stdout.splitlines() == ["model.d_ff=32", "train.warmup_steps=10"]
    assert again.stderr.splitlines() == [f"recipe: light (chosen before ({out}): kept, as the run continues)"]


def test_the_command_refuses_a_bad_variants_file_in_one_line(tmp_path: Path) -> None:
    variants = tmp_path / "variants.yaml"
    variants.write_text("variants: [{name: a, min_updates: 0, overrides: [model.nope=1]}]", encoding="utf-8")
    proc = _choose("--config", "configs/multi30k_en_de.yaml", "--variants", str(variants))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"aiayn choose-recipe: error: {variants}: variants[0] (a): model.nope: unknown field"]


def test_a_short_run_of_the_shipped_recipe_keeps_its_own_schedule() -> None:
    """The tiny runs the recipe tests make (12 updates, warmup 4) pass the light variant's check:
    the caller's overrides win over a variant's, as they do in training."""
    short = ("train.max_time_minutes=0", "train.max_steps=12", "train.warmup_steps=4")
    proc = _choose("--config", "configs/multi30k_en_de.yaml", "--variants", "configs/variants/multi30k.yaml", *short)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # "as written": no overrides
    assert proc.stderr.splitlines() == [
        f"recipe: as written (train.max_steps bounds the run (not time): the recipe's first variant; {cpu_kind()})"]
