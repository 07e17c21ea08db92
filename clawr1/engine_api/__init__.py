"""The engines' API as clawr1 speaks it: the SGLang native HTTP client, weight versions, weight pushes."""
