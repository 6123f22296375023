"""Where the perfkit Jupyter kernel was before experiment/ had rooms: a kernelspec written earlier runs
`python -m perfkit.experiment.kernel`, and keeps working. New kernelspecs name perfkit.experiment.run.kernel."""

from perfkit.experiment.run.kernel import launch_kernel

if __name__ == "__main__":
    launch_kernel()
