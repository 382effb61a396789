"""The environment a job's processes size their thread pools from: the operator sets it on each role's
container from the role's CPUs (kuberl.operator.builders), the trainer reads it (kuberl.trainer.threads).
torch, OpenMP, MKL and OpenBLAS otherwise size themselves to the node's cores, not the pod's."""

#: The pod's whole CPUs: its CPU limit, else its request, rounded up (what Ray is told with --num-cpus).
CPUS_ENV = "KUBERL_CPUS"
#: The pools a BLAS or OpenMP library reads when it loads.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
