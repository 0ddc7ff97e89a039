"""Every command's output paths checked against every input it reads, once, before dispatch
(:func:`confcal.io.guard_outputs`), so no subcommand can forget it."""

from __future__ import annotations

#: options (argparse dests) naming files a command reads
INPUT_DESTS = ("logits", "labels", "domains", "features", "category_ids", "calibrator", "queue", "gt",
               "detections", "domain_map", "mc_scores", "test_logits", "test_labels", "test_features",
               "test_domains", "verify", "decisions", "calibration_logits", "calibration_labels", "calibration_domains")
#: inputs that are one JSON file, never a folder: a folder is named as such before the output guard reads
#: it as a dataset input
JSON_FILE_DESTS = ("calibrator", "decisions")
#: options naming files a command writes
OUTPUT_DESTS = ("output", "csv", "holdout_output")


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def command_inputs(args) -> dict:
    """``{option: spec or list}`` of every input the parsed command line names (``--domain NAME=PATH``
    of domain-eval included)."""
    inputs = {_option(d): getattr(args, d) for d in INPUT_DESTS if getattr(args, d, None)}
    for item in getattr(args, "domain", None) or []:
        name, sep, path = str(item).partition("=")
        if sep:
            inputs.setdefault("--domain", []).append(path)
    return inputs


def check_regular_inputs(args) -> None:
    """Refuse, naming the option, an input path that exists but is neither a regular file nor a folder
    (a FIFO would block the read forever, ``/dev/zero`` would fill the memory), whatever reader the
    command uses for it (arrays, manifests, COCO JSON, queue CSV)."""
    import os

    from confcal.sources import split_spec

    for opt, specs in command_inputs(args).items():
        for spec in [specs] if isinstance(specs, str) else specs:
            text = str(spec)
            if "://" in text:
                continue
            path = str(split_spec(text)[0])
            if opt in {_option(d) for d in JSON_FILE_DESTS} and os.path.isdir(path):
                raise ValueError(f"{opt} is a folder ({path!r}); expected a JSON manifest file")
            if os.path.exists(path) and not (os.path.isfile(path) or os.path.isdir(path)):
                raise ValueError(f"{opt}: {path!r} is not a regular file (a pipe, device or socket); save the "
                                 "data to a file first")


def guard_command_outputs(args) -> None:
    """Refuse a numeric option outside its cap (:mod:`confcal.cli._shared.caps`), an output that is, contains
    or lies inside an input, two outputs on one path, or an existing folder that is not a dataset of
    the kind written (see :func:`confcal.io.guard_outputs`)."""
    from confcal.cli._shared.caps import check_caps
    from confcal.io import guard_outputs

    check_caps(args)  # numeric options inside their documented caps, before any work
    check_regular_inputs(args)  # only regular files (and dataset folders) are read: no FIFO, device, socket
    for d in (*OUTPUT_DESTS, "output_dir"):  # '' (an unset shell variable) is not "no output" (T37)
        if getattr(args, d, None) == "" or (isinstance(getattr(args, d, None), str) and not getattr(args, d).strip()):
            raise ValueError(f"{_option(d)}: expected a file path, got {getattr(args, d)!r}")
    folder = getattr(args, "output_dir", None)
    if isinstance(folder, str):  # demo: a folder it creates or fills; checked before the demo runs (T38)
        import os

        if os.path.exists(folder) and not os.path.isdir(folder):
            raise ValueError(f"--output-dir: {folder!r} exists and is not a folder; name a folder (it is created "
                             "if missing)")
    outputs = {_option(d): getattr(args, d) for d in OUTPUT_DESTS
               if isinstance(getattr(args, d, None), str) and getattr(args, d)}
    if not outputs:
        return
    # a distributed apply writes (and replaces) a Parquet dataset folder
    folders = ("--output",) if getattr(args, "engine", None) == "dask" and args.command == "apply" else ()
    guard_outputs(outputs, command_inputs(args), dataset_folders=folders)
