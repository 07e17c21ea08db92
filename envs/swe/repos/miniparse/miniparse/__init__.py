"""miniparse: a small INI reader and writer, and a CSV line splitter and writer."""
from miniparse.csvline import convert_rows, join_line, parse_csv, quote_field, split_line, write_csv
from miniparse.ini import IniError, dump_ini, merge_ini, parse_ini, with_defaults

__all__ = ["IniError", "convert_rows", "dump_ini", "join_line", "merge_ini", "parse_csv", "parse_ini", "quote_field",
           "split_line", "with_defaults", "write_csv"]
