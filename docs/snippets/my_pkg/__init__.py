"""The predictors the documentation's example DAGs name (``my_pkg.models:Predictor``...).

tests/test_docs.py calls each on a batch as Ray Data would give it. To run the examples, put
this folder on the Ray workers' ``sys.path`` (an embedded Ray's workers get the task's) or
install it in the cluster's image.
"""
