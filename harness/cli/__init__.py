"""The ``mlafuzz`` command line: main.py parses and dispatches, one module per subcommand
(<name>_cmd.py), args.py the shared argument types. Commands decide nothing themselves: they call
harness/drive and print what reports/console.py words."""
