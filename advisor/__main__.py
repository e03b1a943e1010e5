from advisor.cli import program

program()
