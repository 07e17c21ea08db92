"""slugkit: small text utilities (slugs, truncation, case conversion, wrapping)."""
from slugkit.text import camel_to_snake, count_words, slugify, snake_to_camel, title_case, truncate, wrap

__all__ = ["camel_to_snake", "count_words", "slugify", "snake_to_camel", "title_case", "truncate", "wrap"]
