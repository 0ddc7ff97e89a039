"""``confcal export``: a fitted calibrator's head as an ONNX graph or a TorchScript file.

torch and onnx are imported only inside :func:`run` (the command line loads lazily).
"""

from __future__ import annotations


def register(sub):
    p = sub.add_parser(
        "export", help="export a fitted calibrator as an ONNX graph or a TorchScript module",
        description="Write the calibrated head of a manifest: inputs 'logits' (n, K) (box scores (n,) for "
                    "det-ts/det-platt) and, for grouped maps, 'domain_index' or 'group_index' int64 (n,); output "
                    "'probs', equal to predict_proba. The graph's metadata holds the method, the manifest's "
                    "sha256 and the id-to-index table (an index outside it uses the pooled fit).")
    p.add_argument("--calibrator", required=True, help="manifest written by 'confcal fit'")
    p.add_argument("--format", choices=["onnx", "torchscript"], help="output format (required to export)")
    p.add_argument("-o", "--output", help="output file (.onnx, or .pt for torchscript; required to export)")
    p.add_argument("--dtype", choices=["float32", "float64"],
                   help="input/output dtype (default: float32 for onnx, float64 for torchscript)")
    p.add_argument("--verify", metavar="HEAD", help="instead of exporting: check that HEAD was exported from "
                   "--calibrator (same manifest sha256) and computes its map (HEAD run on fixed probe rows "
                   "equals predict_proba within 1e-5 for float32, 1e-9 for float64); exit 2 if not (--format "
                   "and --output are then not needed)")
    p.set_defaults(func=run)


def run(args) -> int:
    from confcal.catalog import MissingExtraError

    try:
        from confcal import export
    except ModuleNotFoundError as exc:  # the optional extras
        # the export extra brings torch too (the heads are torch modules that write their ONNX graph)
        raise MissingExtraError(f"export needs {exc.name}, which is not installed: "
                                "pip install 'confcal[export]' (with a CPU build of torch installed first)") from None
    if args.verify:
        export.verify_manifest(args.verify, args.calibrator)
        print(f"{args.verify}: made from {args.calibrator} (sha256 and map checked on probe rows)")
        return 0
    missing = [o for o, v in (("--format", args.format), ("--output", args.output)) if not v]
    if missing:
        raise ValueError(f"{' and '.join(missing)}: required to export (or give --verify HEAD to check a head)")
    suffix = args.output.lower().rsplit(".", 1)[-1] if "." in args.output else ""
    want = {"onnx": ("onnx",), "torchscript": ("pt", "pth", "torchscript")}[args.format]
    if suffix not in want:
        raise ValueError(f"--output: expected a .{want[0]} file for --format {args.format}, got {args.output!r}")
    if args.format == "onnx":
        try:
            import onnx  # noqa: F401
        except ModuleNotFoundError:
            raise MissingExtraError("--format onnx needs the onnx package, which is not installed: "
                                    "pip install 'confcal[export]'") from None
        export.export_onnx(args.calibrator, args.output, dtype=args.dtype or "float32")
    else:
        export.export_torchscript(args.calibrator, args.output, dtype=args.dtype or "float64")
    meta = export.read_metadata(args.output)
    extra = f", {meta['confcal.index_input']} from {len(eval_table(meta))} ids" if "confcal.index_table" in meta \
        else ""
    print(f"wrote {args.output}: {meta['confcal.method']} head, manifest sha256 "
          f"{meta['confcal.manifest_sha256'][:12]}...{extra}")
    return 0


def eval_table(meta) -> list:
    import json

    return json.loads(meta["confcal.index_table"])
