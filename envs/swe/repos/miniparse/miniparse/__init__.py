"""miniparse: a small INI reader and a CSV line splitter."""
from miniparse.csvline import parse_csv, split_line
from miniparse.ini import IniError, parse_ini

__all__ = ["IniError", "parse_csv", "parse_ini", "split_line"]
