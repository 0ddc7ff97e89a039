"""Private fitting machinery shared by the families: solvers (TS, logistic, ODIR, L-BFGS / Newton),
logit maps and links, and (in ``jobs``) the per-batch statistics of the streamed full-data fits."""
