"""torch-uncertainty glue shared by the comparators built from its layers and models
(``common``: vision; ``text``: the text backbones). Not methods: nothing here registers."""
