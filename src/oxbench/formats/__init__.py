"""Readers and writers of the official files (ground truth, rankings, result files).

One parser per format, shared by every dataset that uses it: the Oxford text files serve Oxford and
Paris; the revisitop pickles serve every revisited set and the old-protocol pickles.
"""
