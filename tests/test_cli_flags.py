"""One flag vocabulary (dalle_lab/flags.py): every command line's every flag has help that shows its default, the
older names of a concept land in the canonical name's setting, and the time and precision spellings translate."""
import argparse
import importlib

import pytest

from dalle_lab.flags import CONCEPTS, OUTPUT_DIR, HelpFormatter, shown_default


# each command line's parser: (module, the function that builds it), imported only by the test that uses it
BUILDERS = {"train_dalle": ("dalle_lab.training.cli", "build_train_parser"),
            "generate": ("dalle_lab.cli.generate", "build_parser"),
            "train_vae": ("dalle_lab.cli.train_vae", "build_parser"),
            "align": ("dalle_lab.align.command_line", "build_parser"),
            "parity": ("dalle_lab.precision.parity", "build_parser"),
            "bpe": ("dalle_lab.tokenizers.train", "build_parser"),
            "quality": ("dalle_lab.quality", "build_parser")}


def _builder(module: str, function: str):
    return lambda: getattr(importlib.import_module(module), function)()


PARSERS = {name: _builder(*where) for name, where in BUILDERS.items()}
# flags a launcher passes, hidden on purpose
HIDDEN = {"--local_rank"}
# the concepts each command line has: every name of the concept must be there, in one setting
HAS = {
    "train_dalle": ["output folder", "learning rate", "steps", "gradient clipping", "gradient accumulation",
                    "ZeRO stage", "start afresh"],
    "generate": ["output folder"],
    "train_vae": ["output folder", "learning rate", "steps", "start afresh"],
    "align": ["output folder", "learning rate", "gradient clipping", "gradient accumulation", "ZeRO stage",
              "start afresh"],
    "parity": ["output folder"],
}


def shown_help(parser, action) -> str:
    """The help text argparse prints for one flag (its %-formatting applied)."""
    return parser._get_formatter()._expand_help(action)


@pytest.mark.parametrize("name", PARSERS)
def test_every_flag_has_help_that_shows_its_default(name):
    parser = PARSERS[name]()
    assert parser.formatter_class is HelpFormatter, name
    assert parser.format_help()  # formats as a whole (a stray % in a help text would raise here)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if action.help == argparse.SUPPRESS:
            assert set(action.option_strings) <= HIDDEN, action.option_strings
            continue
        assert (action.help or "").strip(), f"{name} {action.option_strings}: no help"
        text = shown_help(parser, action)
        wanted = "(required)" if action.required else "default"
        assert wanted in text, f"{name} {action.option_strings}: {text!r} shows no {wanted}"


@pytest.mark.parametrize("name", HAS)
def test_the_older_names_of_a_concept_land_in_the_canonical_setting(name):
    parser = PARSERS[name]()
    flags = parser._option_string_actions
    for concept in HAS[name]:
        names = CONCEPTS[concept]
        missing = [n for n in names if n not in flags]
        assert not missing, f"{name} lacks {missing} ({concept})"
        assert len({flags[n].dest for n in names}) == 1, f"{name}: {concept} lands in several settings"
        # each name, given alone, sets the same value
        given = [] if flags[names[0]].nargs == 0 else ["3"]
        parsed = {n: getattr(parser.parse_args([*required(name), n, *given]), flags[n].dest) for n in names}
        assert len(set(parsed.values())) == 1 and parsed[names[0]] != flags[names[0]].default, parsed


def required(name) -> list[str]:
    return {"generate": ["--dalle_path", "d.pt", "--text", "a"], "align": ["--dalle_path", "d.pt"],
            "parity": ["--head_path", "h.pth"]}.get(name, [])


def test_generate_leads_with_dallepytorchs_outputs_dir_and_the_trainers_with_output_dir():
    assert PARSERS["generate"]()._option_string_actions["--out_dir"].option_strings[0] == "--outputs_dir"
    for build in (PARSERS[name] for name in ("train_dalle", "train_vae", "align", "parity")):
        assert build()._option_string_actions["--outputs_dir"].option_strings[0] == OUTPUT_DIR[0]


def test_a_time_limit_in_minutes_or_seconds_is_one_setting():
    dalle, align = PARSERS["train_dalle"](), PARSERS["align"]()
    assert dalle.parse_args(["--time_budget_s", "90"]).max_minutes == 1.5
    assert dalle.parse_args(["--max_minutes", "2"]).max_minutes == 2
    assert align.parse_args(["--dalle_path", "d", "--max_minutes", "2"]).time_budget_s == 120
    assert align.parse_args(["--dalle_path", "d", "--time_budget_s", "90"]).time_budget_s == 90
    with pytest.raises(SystemExit):
        dalle.parse_args(["--max_minutes", "0"])


@pytest.mark.parametrize("flags,amp,amp_dtype,vae_precision", [
    ([], True, "auto", "auto"),
    (["--precision", "fp32"], False, "auto", "fp32"),
    (["--no-amp"], False, "auto", "fp32"),
    (["--no_amp"], False, "auto", "fp32"),
    (["--precision", "bf16"], True, "bf16", "bf16"),
    (["--no-amp", "--amp"], True, "auto", "auto"),
])
def test_precision_has_the_same_spellings_in_both_trainers(flags, amp, amp_dtype, vae_precision):
    args = PARSERS["train_dalle"]().parse_args(flags)
    assert (args.amp, args.amp_dtype) == (amp, amp_dtype)
    assert PARSERS["train_vae"]().parse_args(flags).precision == vae_precision


def test_booleans_take_both_negative_spellings_and_show_on_or_off():
    parser = PARSERS["train_dalle"]()
    assert parser.parse_args(["--no_progress"]).progress is False
    assert parser.parse_args(["--no-progress"]).progress is False
    assert parser.parse_args(["--no-progress", "--progress"]).progress is True
    text = parser.format_help()
    assert "--progress, --no-progress" in text and "--no_progress" not in text
    assert shown_default(True) == "on" and shown_default(None) == "none" and shown_default((1, 2), "+") == "1 2"


def test_reward_help_lists_every_reward_name():
    from dalle_lab.rewards.registry import REWARD_NAMES

    parser = PARSERS["align"]()
    text = shown_help(parser, parser._option_string_actions["--reward"])
    assert REWARD_NAMES and all(reward in text for reward in REWARD_NAMES)
