"""The `cvae` command line: its parser, help texts and flag types; above every stage."""
