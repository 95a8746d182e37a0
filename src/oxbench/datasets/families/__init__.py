"""The dataset families, one module each, holding the family class and its catalog entries.

- :mod:`.revisited` -- ROxford / RParis, ``gnd_<id>.pkl`` plus ``jpg/``;
- :mod:`.original` -- Oxford 5K / Paris 6K, the text ground truth plus every usable image in ``jpg/``;
- :mod:`.holidays` -- ``holidays_images.dat`` plus ``jpg/`` (or ``jpg_rotated/``);
- :mod:`.ukbench` -- ``jpg/ukbench00000.jpg`` ...;
- :mod:`.distractors` -- R1M (the order of its official list) and Oxford 100K (sorted names);
- :mod:`.synthetic` -- the generated city, built on first ``load``;
- :mod:`.gldv2` -- Google Landmarks v2 retrieval, the solution file plus the index list;
- :mod:`.ilias` -- ILIAS, its id files (images optional: descriptors come from feature files).

The catalog (:mod:`oxbench.datasets.catalog`) imports every module here on its first lookup; a
family never imports another (what the Oxford and Paris families share is content,
``_oxford_paris``). Database order:

- revisited sets, Holidays: the order of the official list (``imlist``, ``holidays_images.dat``);
- Oxford 5K / Paris 6K (original protocol): the sorted image names found in ``jpg/`` (Paris minus
  its 20 corrupt images) -- the text files name images, not indices;
- UKBench: ``ukbench00000`` ... ``ukbench10199``;
- distractors: the order of the list file the entry declares (R1M's ``revisitop1m.txt``), else
  the sorted relative paths (Oxford 100K);
- GLDv2: the order of ``index.csv``; ILIAS: the positives sorted, then the listed distractors.
"""

#: The order ``oxbench data list`` shows the built-in entries in (the catalog imports these first,
#: then any other module here).
ORDER = (
    "original",
    "revisited",
    "distractors",
    "holidays",
    "ukbench",
    "synthetic",
    "gldv2",
    "ilias",
)
