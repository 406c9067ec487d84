"""The ``sglang`` command (console script ``sglang = sglang.cli.main:main``): ``sglang serve ...``,
``sglang version``. There is no ``__main__`` here: it runs only as the installed script."""

import argparse

from sglang.version import __version__


def version(args, extra_argv):
    print(f"sglang version: {__version__}")


def main():
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="subcommand", required=True)
    subparsers.add_parser("serve", help="Launch an SGLang server.", add_help=False)
    version_parser = subparsers.add_parser("version", help="Show the version information.")
    version_parser.set_defaults(func=version)

    args, extra_argv = parser.parse_known_args()
    if args.subcommand == "serve":
        from sglang.cli.serve import serve

        return serve(args, extra_argv)
    version(args, extra_argv)
    return 0
