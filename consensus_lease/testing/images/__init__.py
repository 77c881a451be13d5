"""The container kit's image recipes, shipped in the package so that no source checkout
is needed: ``consensus-lease kit build-images`` (or ``python -m
consensus_lease.testing.images``) builds them. See :mod:`.build`.
"""

from .build import RECIPES, BuildError, Recipe, build_images, recipe_dir

__all__ = ["RECIPES", "BuildError", "Recipe", "build_images", "recipe_dir"]
