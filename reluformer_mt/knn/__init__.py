"""kNN-MT: a token-level memory for every family (Khandelwal et al., ICLR 2021, arXiv:2010.00710).

- :mod:`~reluformer_mt.knn.datastore`: build, store and search (decoder state -> next token) entries;
- :mod:`~reluformer_mt.knn.readout`: how neighbours become a distribution (softmax, ReLU, sparse);
- :mod:`~reluformer_mt.knn.search`: the mixing at every beam step, full or per-input datastores (SK-MT);
- :mod:`reluformer_mt.experiments.knn_tune`: the search values chosen on the validation split (it decodes, so it sits above the translator).

docs/KNN_MT.md has the commands and the choices; docs/history/KNN_MT.md the measured numbers.
"""
