"""The op table (table.py) and each op's row (<op>.py); op.py defines the row and the table."""
