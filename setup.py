"""Maps import names onto the folders (orchard -> libs/orchard, orchard.services -> services,
orchard.trainers -> trainers) so a module's import path tells where it lives."""

from setuptools import find_packages, setup

ROOTS = {
    "orchard": "libs/orchard",
    "orchard.services": "services",
    "orchard.trainers": "trainers",
    "aks_modal": "libs/aks_modal",
}

packages = []
for name, folder in ROOTS.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

# Data files: the bundled ToyRepair task set (repos + tasks.jsonl), and the bundled web tasks with the practice
# sites they run on.
setup(
    packages=packages,
    package_data={
        "orchard.tasks": ["toyrepair/tasks.jsonl", "toyrepair/repos/**/*", "toyrepair/repos/*/.gitignore"],
        "orchard.tasks.web": ["tasks.jsonl", "sites/**/*"],
        "orchard.tasks.assistant": ["tasks.jsonl"],
        "orchard.assistant": ["sandbox/*.py"],
        "orchard.services.reward": ["rubrics/*.yaml"],
    },
)
